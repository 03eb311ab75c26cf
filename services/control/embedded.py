"""The control plane inside `stare train`: the app over the in-memory RunState, uvicorn in a
background thread on localhost. The URL is logged and written to `<run dir>/control.json`
(removed at shutdown) so `stare ctl` and tests can find a server started on port 0 or on a
fallback port."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Self

from services.control.app import create_app
from services.control.auth import resolve_token
from services.control.server import BackgroundServer
from stare.config import TrainConfig
from stare.observe.files import write_atomic
from stare.runstate.base import RunState


class EmbeddedControlPlane:
    def __init__(self, cfg: TrainConfig, state: RunState, log: Callable[[str], None]):
        settings = cfg.control_plane
        token = resolve_token(settings)
        self.server = BackgroundServer(
            create_app(state, settings, cfg.run.name, token=token), settings.host, settings.port, say=log
        )
        self.info_path = Path(cfg.run_dir) / "control.json"
        self.log = log
        if token is None and not settings.allow_unauthenticated:
            auth = (
                "read-only: set STARE_API_TOKEN (or --set control_plane.token_file=PATH) to change the target, or "
                "--set control_plane.allow_unauthenticated=true"
            )
        else:
            auth = "token required for changes" if token else "changes allowed without a token"
        self.auth_note = auth

    def __enter__(self) -> Self:
        self.server.start()
        write_atomic(self.info_path, json.dumps({"url": self.server.url}))
        self.log(f"control plane: {self.server.url} (dashboard; API under /v1; {self.auth_note})")
        return self

    def __exit__(self, *exc) -> None:
        self.info_path.unlink(missing_ok=True)
        self.server.stop()
