"""Devices and jobs on the wire: topics, documents, states and signatures (issue 52).

The device daemon (agent/device/), the operator's commands and the simulator all speak
through these modules only; nothing here does IO beyond what ``signing`` reads from key files.
"""
