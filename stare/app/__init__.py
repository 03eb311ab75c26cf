"""Applications: what wires the roles and the core together (CLI commands, launchers, the simulator)."""
