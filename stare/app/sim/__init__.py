"""`stare sim`: a GPU node simulated on CPU with the real scheduling (docs/performance.md)."""
