"""Whole fleets of agent cores in memory (simulate/virtual_fleet.py): tens to hundreds of
rounds each, with faults. No broker and no process, but a fleet's worth of CPU per test, so
they live here and not in tests/unit (which tests one module at a time)."""
