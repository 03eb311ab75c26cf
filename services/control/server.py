"""Serving the app with uvicorn: in the foreground (`stare control`) or in a background thread of
`stare train` (`BackgroundServer`: binds first, falls back to a free port when the configured one
is taken, stops cleanly). Uvicorn's access log is off: request lines could carry a token in a
query string some client put there.

The listening socket is created with proto=IPPROTO_TCP: asyncio sets TCP_NODELAY on accepted
sockets only when `sock.proto == IPPROTO_TCP` (base_events._set_nodelay), and a socket made with
proto 0 passes that on to every accepted one, so each keep-alive response waited ~40 ms on Nagle's
algorithm and the peer's delayed ACK. Limits (control section): `limit_concurrency` caps
connections, `timeout_keep_alive` closes idle ones, limits.GuardedH11Protocol closes connections
whose headers do not arrive in time, h11's incomplete-event bound caps the headers' size."""

from __future__ import annotations

import errno
import logging
import os
import socket
import threading
import time
from collections.abc import Callable

from stare.config import ControlPlaneSection
from stare.runtime.net import port_in_use

log = logging.getLogger(__name__)


def bind(host: str, port: int, *, fallback: bool = True, say: Callable[[str], None] | None = None) -> socket.socket:
    """A listening socket on host:port; port 0 or (with fallback) a taken port gives a free one, and
    `say` (else a log warning) gets one line naming the process that holds the configured port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for candidate in (port, 0) if port and fallback else (port,):
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # see the module docstring
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, candidate))
        except OSError as err:
            sock.close()
            if fallback and err.errno == errno.EADDRINUSE and candidate != 0:
                (say or log.warning)(
                    f"control plane: {port_in_use(host, candidate)}; serving on a free port instead "
                    "(control_plane.port chooses one; a compose deployment publishes 8321 too: STARE_CONTROL_PORT "
                    "moves it)"
                )
                continue
            raise
        sock.listen(128)
        sock.set_inheritable(True)
        return sock
    raise AssertionError("unreachable")


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    host = "127.0.0.1" if host in ("0.0.0.0", "", "::") else (f"[{host}]" if ":" in host else host)
    return f"http://{host}:{port}"


def _config(app, sock: socket.socket):
    import uvicorn

    from services.control.limits import guarded_protocol

    limits: ControlPlaneSection = getattr(app.state, "settings", None) or ControlPlaneSection()  # create_app sets it
    host, port = sock.getsockname()[:2]
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        access_log=False,
        log_level="warning",
        lifespan="off",
        timeout_graceful_shutdown=2,
        http=guarded_protocol(limits.header_timeout_s),
        timeout_keep_alive=limits.keepalive_timeout_s,
        limit_concurrency=limits.max_connections,
        h11_max_incomplete_event_size=16 * 1024,
    )


LISTEN_FD_ENV = "STARE_CONTROL_FD"  # a listening socket handed over by `stare up`, which holds its port


def inherited_socket() -> socket.socket | None:
    """The listening socket `stare up` passed down (STARE_CONTROL_FD), if any."""
    fd = os.environ.get(LISTEN_FD_ENV)
    return socket.socket(fileno=int(fd)) if fd else None


def serve_forever(app, host: str, port: int) -> None:
    """Run until SIGINT/SIGTERM (uvicorn's handlers), on exactly host:port, or on the socket `stare up`
    handed over."""
    import uvicorn

    sock = inherited_socket() or bind(host, port, fallback=False)
    print(f"stare control plane: {url_of(sock)} (dashboard at /, API under /v1, spec at /openapi.json)", flush=True)
    uvicorn.Server(_config(app, sock)).run(sockets=[sock])


class BackgroundServer:
    """uvicorn in a daemon thread. `start()` returns once it accepts connections; `stop()` ends it."""

    def __init__(self, app, host: str, port: int, say: Callable[[str], None] | None = None):
        import uvicorn

        self.sock = bind(host, port, say=say)
        self.url = url_of(self.sock)
        self.server = uvicorn.Server(_config(app, self.sock))
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, name="stare-control", daemon=True
        )

    def start(self, timeout_s: float = 10.0) -> BackgroundServer:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the control plane did not start on {self.url} within {timeout_s}s")
            time.sleep(0.02)
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout_s)
        self.sock.close()
