"""The `stare` command line."""
