"""The control plane's resource limits against a real `stare control` process (a subprocess, so its
memory can be measured) over a real password-protected redis-server: oversized bodies are refused
before they are read, liveness stays fast meanwhile, stalled headers and bodies are cut off."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading
import time

import httpx
import psutil
import pytest
from control_helpers import TOKEN
from redis_fixtures import free_port

from learner.engine.deepspeed_engine import child_env
from services.control.server import BackgroundServer, bind

MB = 1024 * 1024
LIMIT = 65536


@pytest.fixture(scope="module")
def server(redis_url, tmp_path_factory):
    from stare.transport.redis_secrets import write_secret

    url_file = write_secret(tmp_path_factory.mktemp("secrets") / "redis.url", redis_url)
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stare.app.cli",
            "control",
            "--redis-url-file",
            str(url_file),
            "--port",
            str(port),
            "--set",
            "run.name=limits",
            "--set",
            f"control_plane.max_body_bytes={LIMIT}",
            "--set",
            "control_plane.header_timeout_s=1",
            "--set",
            "control_plane.body_timeout_s=1",
        ],
        env={**child_env(), "STARE_API_TOKEN": TOKEN},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(base + "/v1/ready", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, "stare control did not become ready"
        time.sleep(0.2)
    yield proc, port
    proc.send_signal(2)
    out = proc.communicate(timeout=30)[0]
    password = redis_url.split("@")[0].rsplit(":", 1)[-1]
    assert password not in out and TOKEN not in out  # never logged


def _rss(proc) -> int:
    return psutil.Process(proc.pid).memory_info().rss


class _Liveness(threading.Thread):
    """GET /v1/health every 50 ms until stopped; keeps the slowest answer."""

    def __init__(self, port: int):
        super().__init__(daemon=True)
        self.port, self.stop, self.slowest, self.count = port, threading.Event(), 0.0, 0

    def run(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self.stop.is_set():
                t0 = time.perf_counter()
                assert client.get(f"http://127.0.0.1:{self.port}/v1/health").status_code == 200
                self.slowest, self.count = max(self.slowest, time.perf_counter() - t0), self.count + 1
                time.sleep(0.05)


def _read_until_closed(sock) -> bytes:
    """The whole reply (headers and body may come in separate packets), up to the server's close."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def _status(reply: bytes) -> int:
    return int(reply.split(b" ", 2)[1])


def _upload(port: int, head: bytes, chunks) -> tuple[bytes, int]:
    """Send `head` then `chunks` until the server closes; returns (its reply, bytes of body sent)."""
    reply: list[bytes] = []
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)

    def read() -> None:
        try:
            while data := sock.recv(65536):
                reply.append(data)
        except OSError:
            pass

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    sent = 0
    try:
        sock.sendall(head)
        for chunk in chunks:
            sock.sendall(chunk)
            sent += len(chunk)
    except OSError:  # the server closed the connection: expected
        pass
    reader.join(10)
    sock.close()
    return b"".join(reply), sent


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_100_mb_body_without_a_token_is_refused_before_it_is_read(server, framing):
    proc, port = server
    httpx.get(f"http://127.0.0.1:{port}/v1/status", timeout=5)  # warm up the routes
    before = _rss(proc)
    live = _Liveness(port)
    live.start()
    while live.count == 0:
        time.sleep(0.01)
    block = b"x" * MB
    probes: list[float] = []

    def body(frame):
        for i in range(100):
            yield frame(block)
            if i == 2:  # mid-upload, on another connection
                t0 = time.perf_counter()
                assert httpx.get(f"http://127.0.0.1:{port}/v1/health", timeout=5).status_code == 200
                probes.append(time.perf_counter() - t0)

    head = b"PATCH /v1/entropy HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    if framing == "content-length":
        reply, sent = _upload(port, head + b"Content-Length: %d\r\n\r\n" % (100 * MB), body(lambda b: b))
    else:
        reply, sent = _upload(
            port, head + b"Transfer-Encoding: chunked\r\n\r\n", body(lambda b: b"%x\r\n%s\r\n" % (len(b), b))
        )
    grown = (_rss(proc) - before) / MB
    live.stop.set()
    live.join(10)
    assert _status(reply) == 413 and b"control_plane.max_body_bytes" in reply
    assert sent < 100 * MB  # cut off: the server did not read the rest
    assert grown < 50, f"the server grew by {grown:.1f} MB"
    slowest = max([live.slowest, *probes])
    print(
        f"{framing}: body sent {sent / MB:.0f} MB before the server closed, RSS +{grown:.1f} MB, "
        f"slowest /v1/health {slowest * 1000:.0f} ms ({live.count} probes)"
    )
    assert slowest < 0.5, f"/v1/health took {slowest:.3f}s"
    ok = httpx.get(f"http://127.0.0.1:{port}/v1/health", timeout=5)
    assert ok.status_code == 200  # and it still serves


def test_a_body_at_the_limit_passes_on_to_auth(server):
    _, port = server
    body = b'{"target": 0.3' + b" " * (LIMIT - 15) + b"}"
    assert len(body) == LIMIT
    r = httpx.patch(
        f"http://127.0.0.1:{port}/v1/entropy", content=body, timeout=5, headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 401  # read, then refused for the missing token


def test_a_connection_without_complete_headers_is_closed(server):
    _, port = server
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never finished
        t0 = time.monotonic()
        assert sock.recv(1024) == b""  # closed by the server
        assert time.monotonic() - t0 < 5  # header_timeout_s=1 (not the 60 s+ before)


def test_a_stalled_body_is_answered_408(server):
    _, port = server
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            b"PATCH /v1/entropy HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"target"'
        )
        reply = _read_until_closed(sock)
    assert _status(reply) == 408 and b"control_plane.body_timeout_s" in reply


def test_accepted_sockets_get_tcp_nodelay():
    """asyncio sets TCP_NODELAY on accepted sockets only if the listening socket's proto is TCP."""
    seen: list[int] = []

    async def main() -> None:
        sock = bind("127.0.0.1", 0)
        server = await asyncio.start_server(
            lambda r, w: (
                seen.append(w.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)),
                w.close(),
            ),
            sock=sock,
        )
        port = sock.getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.01)
        writer.close()
        server.close()

    asyncio.run(main())
    assert seen and seen[0] != 0


def _in_thread_server(state, **settings):
    from services.control.app import create_app
    from stare.config import ControlPlaneSection

    return BackgroundServer(
        create_app(state, ControlPlaneSection(**settings), "run", token=TOKEN), "127.0.0.1", 0
    ).start()


def test_connections_past_the_cap_get_503():
    from stare.runstate import MemoryRunState

    server = _in_thread_server(MemoryRunState("run"), max_connections=8, header_timeout_s=30)
    port = int(server.url.rsplit(":", 1)[1])
    idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(10)]
    try:
        time.sleep(0.2)
        assert httpx.get(server.url + "/v1/health", timeout=5).status_code == 503
    finally:
        for s in idle:
            s.close()
        server.stop()


def test_a_client_leaving_an_sse_stream_mid_backlog_is_logged_once(caplog):
    from control_helpers import started

    from learner.algorithm.entropy_controller import EntropyController
    from stare.config.algo import ControllerConfig
    from stare.runstate import MemoryRunState

    state = MemoryRunState("run")
    controller = EntropyController(ControllerConfig())
    control = started(state, controller)
    for step in range(1, 3001):
        control.after_step(controller, {"step": step, "entropy": 0.2, "pad": "x" * 200})
    server = _in_thread_server(state)
    try:
        with caplog.at_level("INFO"):
            with httpx.stream("GET", server.url + "/v1/metrics/stream?limit_s=30", timeout=5) as r:
                next(r.iter_bytes())  # the first bytes of a ~1 MB backlog, then leave
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not any("metrics stream" in m for m in caplog.messages):
                time.sleep(0.1)
            time.sleep(1.0)
    finally:
        server.stop()
    ended = [m for m in caplog.messages if "metrics stream" in m]
    assert len(ended) == 1 and "client left" in ended[0]
    assert not [m for m in caplog.messages if "socket.send() raised exception" in m]
