"""The doctor's check groups: one module each, with `CHECKS` and `run(ctx, report)` (stare.app.doctor.registry)."""
