"""Trajectory transport: prompt tasks -> raw trajectories -> scored trajectories.

`base.py` is the protocol; `in_memory.py` the in-process implementation used by the embedded mode
and unit tests; `redis_streams.py` the Redis-stream implementation for separate processes
(`redis_transport.py` a run's three streams, `redis_client.py` the client, key names and retries,
`redis_dead_letters.py` what a stream parks, `redis_secrets.py` the URL and password); `records.py` the
wire records every stream carries.
"""
