"""The `edgegrove` command line: the device's commands (``agent.cli``) plus the simulator's and
the dashboard's. It sits above ``agent``, ``dashboard`` and ``simulate``; none of them imports it."""
