"""The Compose guide in docs/deploy.md is what scripts/compose_e2e.sh runs, as a newcomer would follow
it: the e2e reads the commands of the guide's CPU sections from the page (scripts/doc_commands.py)
and runs each as written (`doc_run PREFIX`) or says why this host runs it differently
(`doc_replaced PREFIX REASON`); here, without Docker, every documented command is claimed by exactly
one of those calls, the GPU node's commands are the CPU ones with the other profile, the kill phase
checks "down" within 30 s, and the documented status read answers for real against a control plane
with a read token."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from deploy_helpers import REPO

sys.path.insert(0, str(REPO / "scripts"))
from doc_commands import section_commands, strip_comment

E2E = REPO / "scripts" / "compose_e2e.sh"
DEPLOY = REPO / "docs" / "deploy.md"
GUIDE = ["The CPU profile", "Stopping, killing and restarting a role"]


def e2e_text() -> str:
    return E2E.read_text()


def documented(section: str) -> list[str]:
    return section_commands(DEPLOY.read_text(), section)


def claimed_prefixes() -> list[str]:
    return re.findall(r'\bdoc_(?:run|replaced) "([^"]+)"', e2e_text())


def test_the_e2e_reads_the_guides_sections():
    (array,) = re.findall(r"^DOC_SECTIONS=\((.*)\)$", e2e_text(), re.M)
    assert re.findall(r'"([^"]+)"', array) == GUIDE
    assert "python3 scripts/doc_commands.py" in e2e_text() and re.search(r"^DOC=docs/deploy.md$", e2e_text(), re.M)


def test_every_documented_command_is_run_or_replaced_by_the_e2e():
    lines = {line for section in GUIDE for line in documented(section)}
    claimed: dict[str, set[str]] = {p: {line for line in lines if line.startswith(p)} for p in claimed_prefixes()}
    ambiguous_or_unknown = {p: sorted(m) for p, m in claimed.items() if len(m) != 1}
    assert ambiguous_or_unknown == {}, "each doc_run/doc_replaced prefix must name one documented command"
    assert set().union(*claimed.values()) == lines, "a documented command the e2e neither runs nor replaces"
    # replaced, with a reason, only where this host cannot run the line as written
    assert (
        re.findall(r'\bdoc_replaced "([^"]+)" "([^"]{20,})"', e2e_text())[0][0] == "docker compose --profile cpu build"
    )
    assert len(re.findall(r"\bdoc_replaced ", e2e_text())) == 2  # the definition and the one use


def test_the_guide_is_the_newcomers_path_in_order():
    cpu = documented("The CPU profile")
    assert cpu[:4] == [
        "scripts/make_secrets.sh",
        "scripts/compose_preflight.py --profile cpu",
        "docker compose --profile cpu build",
        "docker compose --profile cpu up -d",
    ]
    kill = documented("Stopping, killing and restarting a role")
    assert (
        kill[0] == "docker compose --profile cpu kill learner-cpu" and kill[-1] == "docker compose --profile cpu up -d"
    )
    for line in cpu + kill:
        if line.startswith("docker compose"):
            verb = line.split()[4]
            assert verb in {"build", "up", "ps", "kill"}, line


def test_the_gpu_nodes_commands_are_the_cpu_ones_with_the_other_profile():
    """The GPU path cannot run here; every compose step of it is the tested CPU step, profile swapped."""
    gpu = [line for line in documented("One GPU node: docker compose") if "--profile gpu" in line]
    cpu = set(documented("The CPU profile"))
    only_gpu = {line for line in gpu if " run --rm " in line}  # copying the training data: the tiny task has none
    assert len(only_gpu) == 1
    for line in set(gpu) - only_gpu:
        assert line.replace("--profile gpu", "--profile cpu") in cpu, line


def test_the_kill_phase_waits_at_most_30_s_for_down_then_brings_it_back():
    text = e2e_text()
    phases = re.findall(r"^phase (\w+)$", text, re.M)
    assert phases.index("crash") < phases.index("kill") < phases.index("redeploy")
    kill = text[text.index("\nphase kill\n") : text.index("\nphase redeploy\n")]
    (bound,) = re.findall(r'wait_for "/v1/status to say phase down" (\d+) phase_is down', kill)
    assert int(bound) <= 30
    order = [
        kill.index(s)
        for s in (
            'doc_run "docker compose --profile cpu kill learner-cpu"',
            "phase_is down",
            'die "Docker restarted the learner after docker kill"',
            'doc_run "docker compose --profile cpu up -d"',
            "said_resumed_again",
            "check_each_step_once",
        )
    ]
    assert order == sorted(order)


def test_the_e2e_script_parses_and_calls_only_what_it_defines():
    subprocess.run(["bash", "-n", str(E2E)], check=True, timeout=30)
    text = e2e_text()
    defined = set(re.findall(r"^\s*(\w+)\(\) \{", text, re.M))
    waited = set(re.findall(r'wait_for "[^"]+" \S+ (\w+)', text))
    assert waited - defined <= {"grep", "test"}, waited - defined
    for helper in ("doc_run", "doc_replaced", "doc_line", "doc_all_done", "doc_phase", "names_agree", "phase_is"):
        assert helper in defined, helper
    assert text.rstrip().endswith("}") and "doc_all_done\nphase end" in text


def test_the_documented_status_read_answers_with_the_read_token(tmp_path):
    """The guide's `curl ... /v1/status` line, run as written (bash -c) against a real control plane
    serving a read token from deploy/secrets/api-read-token on STARE_CONTROL_PORT."""
    from services.control.app import create_app
    from services.control.server import BackgroundServer
    from stare.config import ControlPlaneSection
    from stare.runstate import MemoryRunState

    (line,) = {c for c in documented("The CPU profile") if c.startswith("curl ")}
    (tmp_path / "deploy" / "secrets").mkdir(parents=True)
    (tmp_path / "deploy" / "secrets" / "api-read-token").write_text("the-read-token\n")
    state = MemoryRunState("guide")
    state.set_status({"phase": "training", "step": 3})
    settings = ControlPlaneSection(trusted_hosts=["localhost", "127.0.0.1"])
    server = BackgroundServer(
        create_app(state, settings, "guide", token="w", read_token="the-read-token"), "127.0.0.1", 0
    ).start()
    try:
        port = server.url.rsplit(":", 1)[1]
        env = {**os.environ, "STARE_CONTROL_PORT": port}
        done = subprocess.run(["bash", "-c", line], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
        assert json.loads(done.stdout)["phase"] == "down"  # status says training, no learner beats: down
        (tmp_path / "deploy" / "secrets" / "api-read-token").write_text("not-it\n")
        refused = subprocess.run(
            ["bash", "-c", line], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30
        )
        assert json.loads(refused.stdout)["detail"] == "wrong API token"
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("line", "command"),
    [
        ("docker compose up -d            # comment", "docker compose up -d"),
        ('curl -H "a # b" x   # note', 'curl -H "a # b" x'),
        ("echo 'x #y'#z", "echo 'x #y'#z"),
        ("# only a comment", ""),
    ],
)
def test_doc_commands_strips_comments_outside_quotes(line, command):
    assert strip_comment(line) == command


def test_doc_commands_joins_continuations_and_stops_at_the_next_heading():
    page = "## A\n\n```bash\nx \\\n  --y   # c\n```\n\n### B\n\n```bash\nz\n```\n\n## C\n```bash\nw\n```\n"
    assert section_commands(page, "A") == ["x --y", "z"]  # B is inside A
    assert section_commands(page, "B") == ["z"]
    with pytest.raises(KeyError):
        section_commands(page, "D")
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "doc_commands.py"), str(DEPLOY), "No such"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2 and "has no heading 'No such'" in done.stderr


def test_docker_host_setup_says_as_root_not_sudo():
    text = (REPO / "scripts" / "docker_host_setup.sh").read_text()
    assert "sudo" not in text and "# as root" in text
    assert '[ "$(id -u)" = 0 ] ||' in text


def test_the_compose_header_says_docker_kill_is_a_manual_stop():
    header = Path(REPO / "docker-compose.yml").read_text().split("\nname:")[0]
    assert "docker kill" in header and "manual stop" in header
