"""Where stare keeps caches (tiny models, compiled ops): $STARE_CACHE_DIR or ~/.cache/stare."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    return Path(os.environ.get("STARE_CACHE_DIR", Path.home() / ".cache" / "stare"))
