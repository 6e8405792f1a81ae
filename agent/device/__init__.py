"""The device daemon (`edgegrove device`): installed once, it runs the jobs it is given.

``core`` decides (sans-IO: (state, event, now) -> actions); ``daemon`` executes against MQTT,
the state directory and the in-process agent runtime (``execution``).
"""
