"""Services of the distributed system.

* `services.control`: the control plane, a FastAPI app over the run state (`stare.runstate`)
  with the entropy target, run status, metrics, pause / resume / checkpoint, Prometheus metrics and
  a dashboard. It is the only module that imports FastAPI.
* `stare.runtime.process`: what every role process shares (logging, signals, heartbeats, /healthz).
* `services.redis_server`: a redis-server child process (`stare up`, tests, benches).
"""
