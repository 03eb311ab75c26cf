"""deploy/docker without Docker: the Dockerfiles pin their bases and versions, run as a non-root
user, COPY only what exists and .dockerignore lets through, and health-check the real endpoints;
deploy/docker/healthcheck.py is exercised against a local HTTP server. Not covered: building the
images (no Docker engine here)."""

from __future__ import annotations

import http.server
import re
import runpy
import threading
from pathlib import Path

import pytest
from deploy_helpers import REPO

DOCKER = REPO / "deploy" / "docker"
DOCKERFILES = sorted(DOCKER.glob("Dockerfile.*"))
healthcheck = runpy.run_path(str(DOCKER / "healthcheck.py"))


def instructions(path: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", path.read_text())
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1])
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_base_image_is_pinned(path):
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", path.read_text(), re.M))
    (base,) = [arg for op, arg in instructions(path) if op == "FROM"]
    image = args.get(base.strip("${}"), base)
    name, _, tag = image.partition(":")
    assert tag and tag != "latest" and re.search(r"\d+\.\d+\.\d+", tag), f"{image}: pin a full version tag"


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_runs_as_non_root_with_a_health_check(path):
    ops = instructions(path)
    users = [arg for op, arg in ops if op == "USER"]
    assert users and not users[-1].startswith(("root", "0")), "the last USER must not be root"
    (check,) = [arg for op, arg in ops if op == "HEALTHCHECK"]
    assert "/opt/stare/healthcheck.py" in check
    assert any(op == "COPY" and arg.endswith("/opt/stare/healthcheck.py") for op, arg in ops)
    assert ("ENTRYPOINT", '["stare"]') in ops


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_copied_sources_exist_and_pass_dockerignore(path):
    ignore = (REPO / ".dockerignore").read_text().split()
    allowed = [p.lstrip("!").rstrip("/") for p in ignore if p.startswith("!")]
    for op, arg in instructions(path):
        if op != "COPY":
            continue
        for src in arg.split()[:-1]:
            assert (REPO / src).exists(), src
            assert any(src == a or src.startswith(a + "/") for a in allowed), f"{src} is excluded by .dockerignore"


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_every_package_folder_of_pyproject_is_copied(path):
    """`pip install .` in the image needs every folder pyproject.toml maps a package to."""
    import tomllib

    folders = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values())
    copied = {src.rstrip("/") for op, arg in instructions(path) if op == "COPY" for src in arg.split()[:-1]}
    assert folders <= copied, f"not copied: {sorted(folders - copied)}"


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_versions_are_pinned(path):
    constraints = DOCKER / f"constraints-{path.suffix.lstrip('.')}.txt"
    pins = [line for line in constraints.read_text().splitlines() if line and not line.startswith("#")]
    assert pins and all(re.fullmatch(r"[a-z0-9_-]+==[\w.+]+", pin) for pin in pins), pins
    assert "torch==2.13.0" in "\n".join(pins), "the project's torch pin (pyproject.toml)"
    assert "torch==2.13.0" in (REPO / "pyproject.toml").read_text()


def test_no_model_download_in_images():
    for path in DOCKERFILES:
        text = path.read_text()
        assert "HF_HUB_OFFLINE=1" in text
        assert not re.search(r"huggingface-cli|hf download|snapshot_download", text)


def test_healthcheck_reads_the_role_from_pid1_and_picks_the_endpoint(monkeypatch):
    assert healthcheck["CONTROL_PORT"] == 8321
    assert healthcheck["health_url"]("control") == "http://127.0.0.1:8321/v1/health"
    monkeypatch.setenv("STARE_HEALTH_PORT", "8080")
    assert healthcheck["health_url"]("rollout") == "http://127.0.0.1:8080/healthz"
    monkeypatch.delenv("STARE_HEALTH_PORT")
    with pytest.raises(SystemExit):
        healthcheck["health_url"]("reward")


@pytest.mark.parametrize("status, expected", [(200, 0), (503, 1)])
def test_healthcheck_exit_code_follows_the_endpoint(status, expected):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(status if self.path == "/healthz" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        assert healthcheck["main"](["--url", f"http://127.0.0.1:{server.server_port}/healthz"]) == expected
    finally:
        server.shutdown()
        server.server_close()


def test_healthcheck_fails_when_nothing_listens():
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    port = server.server_port
    server.server_close()
    assert healthcheck["main"](["--url", f"http://127.0.0.1:{port}/healthz"]) == 1
