"""The pure protocol core: no IO, no threads, no wall clock.

Functions and state machines take (state, event, now) and return actions; the runtime
(agent/runtime.py) is the only loop that executes them.
"""
