"""Launching the roles: `embedded` (`stare train`: every role in one process over in-memory seams),
`up` (`stare up`: the roles as processes on one node around a redis-server), `ray` (`stare launch
--ray`: the roles as Ray actors), `role_entry` (one role per process: `stare learner|rollout|reward`),
`compose` (`stare up --print-compose`: the same plan as compose services).
"""
