"""Edgegrove edge agent: fault-tolerant tree allreduce over MQTT on small devices."""

__version__ = "0.1.0"
