"""Trajectory transport: prompt tasks -> raw trajectories -> scored trajectories.

`base.py` is the protocol; `memory.py` the in-process implementation used by the embedded mode
and unit tests; `redis_streams.py` the Redis-stream implementation for separate processes.
"""
