"""Core: what a role's process needs at run time.

`process` (the role process runtime: config, Redis, signals, heartbeats, the health endpoint),
`net` (free ports), `timeouts` (in-thread timeouts), `paths` (the cache folder), `run_lock` (one writer
per run folder), `threads` (run.threads against the machine's CPUs).
"""
