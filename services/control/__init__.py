"""The control plane: `create_app(state, settings, run_id)` (app.py) over a RunState, served by
`stare control` (against Redis) and inside `stare train` (in memory). See docs/control-plane.md."""
