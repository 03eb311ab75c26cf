"""End to end: a real `stare train` (subprocess) serves the API on a free port; a target change made
while it runs applies at the next step, the gate follows, `stare ctl` and the dashboard in headless
Chromium (Debian's /usr/bin/chromium through Playwright, no browser download) see and change it.

One training run is shared by the tests of this module (DeepSpeed start-up dominates); each test
pauses it, so "the next step" is exact: the step after the one the learner paused after."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
from train_helpers import fast_override_list

from learner.engine.deepspeed_engine import child_env

pytestmark = pytest.mark.slow
TOKEN = "e2e-token"
CHROMIUM = Path("/usr/bin/chromium")
# The committed docs/images/dashboard.png is refreshed with STARE_UPDATE_SCREENSHOT=1; otherwise the
# screenshot goes to the temporary folder (so a test run leaves the working tree clean).
DOCS_SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "images" / "dashboard.png"


class Run:
    def __init__(self, proc: subprocess.Popen, run_dir: Path, url: str):
        self.proc, self.run_dir, self.url = proc, run_dir, url
        self.api = httpx.Client(base_url=url, timeout=10.0, headers={"Authorization": f"Bearer {TOKEN}"})

    def status(self) -> dict:
        return self.api.get("/v1/status").raise_for_status().json()

    def wait(self, predicate, what: str, timeout_s: float = 120.0):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"stare train exited ({self.proc.returncode}) while waiting for {what}")
            value = predicate()
            if value:
                return value
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}")

    @contextlib.contextmanager
    def paused(self):
        """Pause, yield the step the learner paused after, resume on leaving (also on a failure)."""
        self.api.post("/v1/run/pause").raise_for_status()
        try:
            # (step,): a tuple, so truthy whatever the step
            yield self.wait(lambda: (s := self.status())["phase"] == "paused" and (s["step"],), "the pause")[0]
        finally:
            self.api.post("/v1/run/resume").raise_for_status()

    def step_metrics(self, step: int) -> dict:
        def find():
            items = self.api.get("/v1/metrics/history", params={"offset": -20, "limit": 20}).json()["items"]
            return next((m for m in items if m["step"] == step), None)

        return self.wait(find, f"the metrics of step {step}")


@pytest.fixture(scope="module")
def run(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("e2e")
    overrides = fast_override_list(tiny_model_dir, out / "runs") + [
        # far more steps than the module needs: the run must outlive every test on a fast machine (60
        # steps once ended before the dashboard test opened the page); teardown stops it with SIGINT
        "run.steps=100000",
        "run.checkpoint_every=100000",
        "task.eval_every=2",
        "control_plane.port=0",
    ]
    cmd = [sys.executable, "-m", "stare.app.cli", "train", "--no-progress"] + [
        a for o in overrides for a in ("--set", o)
    ]
    env = {**child_env(), "STARE_API_TOKEN": TOKEN}  # not a process group this pytest process formed
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    run_dir = out / "runs" / "t"
    info = run_dir / "control.json"
    deadline = time.monotonic() + 180
    while not info.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"stare train did not serve the API:\n{proc.communicate()[0][-3000:]}")
        time.sleep(0.2)
    r = Run(proc, run_dir, json.loads(info.read_text())["url"])
    # Steps count from 1 (status step 0 = none done yet). A test that pauses before the first step
    # would look for the metrics of a step 0 that never exists, so hand out a run with a step done.
    r.wait(lambda: (r.status().get("step") or 0) >= 1, "the first step", timeout_s=300.0)
    yield r
    proc.send_signal(signal.SIGINT)  # stops after the current step (also while paused)
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode == 0, output[-3000:]
    assert not info.exists()  # removed at shutdown


def test_a_target_change_applies_at_the_next_step_and_the_gate_follows(run):
    with run.paused() as paused_at:
        before = run.step_metrics(paused_at)
        top = run.api.get("/v1/entropy").json()["max_entropy"]  # ln V: above any entropy the model can have
        assert top is not None and before["target"] != top and before["control_changes"] == 0
        assert run.api.put("/v1/entropy", json={"target": top * 1.01}).status_code == 422  # above ln V
        entry = run.api.put("/v1/entropy", json={"target": top}).raise_for_status().json()["audit"]
    after = run.step_metrics(paused_at + 1)
    assert (after["target"], after["control_changes"], after["control_audit_ids"]) == (top, 1, [entry["id"]])
    assert after["gate"] == 1 and after["entropy_gate_input"] < top  # gate = entropy < target
    audit = {e["id"]: e for e in run.api.get("/v1/entropy/audit").json()}
    assert audit[entry["id"]]["applied_step"] == paused_at + 1
    assert run.api.get("/v1/entropy").json()["target"] == top


def test_stare_ctl_changes_the_target_and_the_gate_turns_off(run):
    ctl = [sys.executable, "-m", "stare.app.cli", "ctl", "--url", run.url, "--token", TOKEN]
    with run.paused() as paused_at:
        out = subprocess.run(
            ctl + ["entropy", "--target", "0.001", "--no-band"], capture_output=True, text=True, timeout=60, check=False
        )
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["audit"]["new"] == {"target": 0.001, "band": None}
        bad = subprocess.run(
            ctl + ["entropy", "--band", "0.5", "0.1"], capture_output=True, text=True, timeout=60, check=False
        )
        assert bad.returncode == 1 and "band" in bad.stderr and "422" in bad.stderr
        subprocess.run(ctl + ["resume"], check=True, capture_output=True, timeout=60)
    after = run.step_metrics(paused_at + 1)
    assert (after["target"], after["gate"]) == (0.001, 0)  # entropy above the new target: gate off


def test_a_checkpoint_request_is_saved_while_paused(run):
    with run.paused() as paused_at:
        run.api.post("/v1/run/checkpoint").raise_for_status()
        run.wait(lambda: (run.run_dir / "checkpoints" / f"step_{paused_at:06d}").exists(), "the checkpoint")
        assert run.status()["checkpoint_requested"] is False


def _wait_in_page(page, predicate: str, timeout_s: float) -> None:
    """Poll a JS function in the page (page.wait_for_function compiles its predicate with eval, which
    the dashboard's CSP forbids; page.evaluate calls a function without eval)."""
    deadline = time.monotonic() + timeout_s
    while not page.evaluate(predicate):
        assert time.monotonic() < deadline, f"not true within {timeout_s}s: {predicate}"
        page.wait_for_timeout(200)


@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed (apt-get install chromium)")
def test_the_dashboard_draws_curves_and_its_form_changes_the_target(run):
    sync_api = pytest.importorskip("playwright.sync_api")
    run.wait(lambda: run.status()["step"] >= 6, "a few steps to draw")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1500, "height": 900})
        violations = []  # the dashboard runs under its Content-Security-Policy (no inline script, no eval)
        page.on("console", lambda m: violations.append(m.text) if "Content Security Policy" in m.text else None)
        page.goto(run.url + "/", timeout=30_000)
        for chart in ("entropy", "reward", "eval", "length", "gate", "wm", "clip", "mismatch"):
            _wait_in_page(page, f"() => Number(document.getElementById('chart-{chart}').dataset.points) > 1", 30)
        inked = page.evaluate("""() => {
            const c = document.getElementById('chart-entropy');
            const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
            let n = 0;
            for (let i = 0; i < d.length; i += 4) if (d[i] < 200 || d[i + 1] < 200 || d[i + 2] < 200) n++;
            return n;
        }""")
        assert inked > 500  # axes alone are light grey (>= 200); the curves are dark
        with run.paused() as paused_at:
            page.fill("#f-token", TOKEN)
            page.fill("#f-target", "0.42")
            page.fill("#f-band-low", "0.3")
            page.fill("#f-band-high", "0.6")
            page.click("#f-submit")
            _wait_in_page(page, "() => document.getElementById('form-message').textContent.includes('accepted')", 15)
            # the audit keeps it (pending would race the paused learner, which applies changes as they come)
            change = run.api.get("/v1/entropy/audit").json()[-1]
            assert change["new"] == {"target": 0.42, "band": [0.3, 0.6]} and change["who"].startswith("dashboard")
        after = run.step_metrics(paused_at + 1)
        assert (after["target"], after["band_low"], after["band_high"], after["control_changes"]) == (0.42, 0.3, 0.6, 1)
        run.wait(lambda: run.status()["step"] >= paused_at + 3, "more steps for the picture")
        page.wait_for_timeout(1500)  # a poll or two
        shot = (
            DOCS_SCREENSHOT
            if os.environ.get("STARE_UPDATE_SCREENSHOT") == "1"
            else Path(tempfile.gettempdir()) / "stare-dashboard.png"
        )
        shot.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(shot), full_page=True)
        browser.close()
    assert violations == []
