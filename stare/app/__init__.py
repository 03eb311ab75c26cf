"""Applications: the command line and the launchers (the layout move brings them here)."""
