"""The control plane (FastAPI). Not built yet: the embedded mode has no API today."""
