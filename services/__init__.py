"""Services of the distributed system. `stare.services.control` is the control plane: a FastAPI app
over the run state (`stare.runstate`) with the entropy target, run status, metrics, pause / resume /
checkpoint, Prometheus metrics and a dashboard. It is the only module that imports FastAPI."""
