"""Every user mistake is one message, not a traceback (stare.app.cli.errors): for each bad input
below `stare` exits 2, prints no traceback, names the offending file or field, and leaves the run
folder as it was (a new run that fails leaves no folder; a resumed one is byte-identical). The CLI
runs in process (`stare.app.cli.main`), fast enough for the whole table."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from train_helpers import fast_override_list

from learner.engine.checkpoints import write_manifest
from stare.app.cli import main
from stare.runtime.threads import usable_cpus

BAD_JSON = '{\n  "a": 1,\n}'  # a trailing comma: line 3
DATA_ROW = {"data_source": "d", "prompt": "1+1=", "reward_model": {"ground_truth": "2"}}


def _snapshot(folder: Path) -> dict[str, str]:
    if not folder.exists():
        return {}
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


def _write(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def _model(tiny: Path, root: Path, change) -> Path:
    model = root / "model"
    shutil.copytree(tiny, model)
    change(model)
    return model


def _truncate(path: Path, keep: int = 100) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def _fake_run(root: Path, tiny: Path, damage=None, config: str | None = None) -> Path:
    """A run folder as `stare train` leaves it (config.yaml, a checkpoint with its manifest)."""
    run = root / "runs" / "old"
    _write(
        run / "config.yaml",
        config if config is not None else f"run:\n  name: old\n  output_dir: {root / 'runs'}\nmodel:\n  path: {tiny}\n",
    )
    _write(run / "metrics.jsonl", '{"step": 1}\n')
    step = run / "checkpoints" / "step_000001"
    _write(step / "mp_rank_00_model_states.pt", b"w" * 1000)
    _write(step / "trainer_state.json", '{"step": 1}')
    write_manifest(step)
    _write(run / "checkpoints" / "latest", "step_000001")
    if damage is not None:
        damage(run)
    return run


# (id, argv builder(root, tiny) -> (argv, run folder to watch), text the message must hold)
CASES = [
    # --- configs
    (
        "yaml-syntax",
        lambda r, t: (["train", "--config", _write(r / "c.yaml", "run:\n  name: x\n steps: [\n")], None),
        ["c.yaml line 3 column 2: invalid YAML"],
    ),
    (
        "yaml-not-utf8",
        lambda r, t: (["train", "--config", _write(r / "c.yaml", b"run:\n  name: \xff\n")], None),
        ["c.yaml line 2 column 9: not UTF-8 (byte 0xff)"],
    ),
    (
        "yaml-top-level-list",
        lambda r, t: (["train", "--config", _write(r / "c.yaml", "- a\n- b\n")], None),
        ["c.yaml: a config file must hold a YAML mapping"],
    ),
    ("config-missing", lambda r, t: (["train", "--config", r / "nope.yaml"], None), ["nope.yaml does not exist"]),
    ("unknown-key", lambda r, t: (["train", "--set", "optim.lrr=1"], None), ["optim.lrr: Extra inputs"]),
    ("out-of-bounds", lambda r, t: (["train", "--set", "run.steps=0"], None), ["run.steps: Input should be greater"]),
    (
        "wrong-type",
        lambda r, t: (["train", "--set", "run.steps=many"], None),
        ["run.steps: Input should be a valid int"],
    ),
    ("set-without-equals", lambda r, t: (["train", "--set", "run.steps"], None), ["--set expects KEY=VALUE"]),
    ("unknown-algo", lambda r, t: (["train", "--algo", "ppo2"], None), ["--algo 'ppo2' is not a known algorithm"]),
    (
        "set-into-a-value",
        lambda r, t: (["train", "--set", "run.name.x=1"], None),
        ["run.name: Input should be a valid string"],
    ),
    # --- model directories
    (
        "model-not-a-folder",
        lambda r, t: (
            ["train", "--set", f"model.path={r / 'nothing'}", "--set", f"run.output_dir={r / 'runs'}"],
            r / "runs" / "tiny-stare",
        ),
        ["model.path: ", "nothing is not a folder"],
    ),
    (
        "model-no-config",
        lambda r, t: _model_args(r, t, lambda m: (m / "config.json").unlink()),
        ["model.path: ", "(no config.json)"],
    ),
    (
        "model-config-corrupt",
        lambda r, t: _model_args(r, t, lambda m: _write(m / "config.json", BAD_JSON)),
        ["config.json line 3 column 1: not valid JSON"],
    ),
    (
        "model-weights-truncated",
        lambda r, t: _model_args(r, t, lambda m: _truncate(m / "model.safetensors", 5000)),
        ["model.safetensors: 5000 bytes, its header declares"],
    ),
    (
        "model-weights-garbage",
        lambda r, t: _model_args(r, t, lambda m: _write(m / "model.safetensors", b"nope")),
        ["model.safetensors: not a safetensors file"],
    ),
    (
        "model-no-weights",
        lambda r, t: _model_args(r, t, lambda m: (m / "model.safetensors").unlink()),
        ["has no weights"],
    ),
    (
        "model-tokenizer-corrupt",
        lambda r, t: _model_args(r, t, lambda m: _truncate(m / "tokenizer.json", 50)),
        ["tokenizer.json line 4 column 3: not valid JSON"],
    ),
    # --- datasets (a new run: the run folder must not be left behind)
    ("data-missing", lambda r, t: (_data_args(r, t, None), r / "runs" / "d"), ["data.jsonl: no such file"]),
    (
        "data-bad-json",
        lambda r, t: (_data_args(r, t, json.dumps(DATA_ROW) + "\n{oops\n"), r / "runs" / "d"),
        ["data.jsonl line 2: not valid JSON"],
    ),
    (
        "data-missing-field",
        lambda r, t: (
            _data_args(r, t, "\n" + json.dumps({"data_source": "d", "prompt": "x"}) + "\n"),
            r / "runs" / "d",
        ),
        ["data.jsonl line 2: missing field 'reward_model.ground_truth'"],
    ),
    (
        "data-not-utf8",
        lambda r, t: (_data_args(r, t, json.dumps(DATA_ROW).encode() + b"\n\xfe\n"), r / "runs" / "d"),
        ["data.jsonl line 2: not UTF-8 (byte 0xfe"],
    ),
    ("data-empty", lambda r, t: (_data_args(r, t, ""), r / "runs" / "d"), ["data.jsonl: no rows"]),
    (
        "data-wrong-answer-type",
        lambda r, t: (
            _data_args(r, t, json.dumps({**DATA_ROW, "reward_model": {"ground_truth": [2]}})),
            r / "runs" / "d",
        ),
        ["data.jsonl line 1: field 'reward_model.ground_truth'"],
    ),
    (
        "data-unknown-suffix",
        lambda r, t: (_data_args(r, t, json.dumps(DATA_ROW), name="data.csv"), r / "runs" / "d"),
        ["data.csv: unknown file type"],
    ),
    # --- resume and checkpoints (the run folder must stay byte-identical)
    (
        "resume-no-config",
        lambda r, t: (["train", "--resume", _write(r / "empty" / "x", "").parent], None),
        ["no config.yaml there"],
    ),
    (
        "resume-no-checkpoint",
        lambda r, t: _resume(r, t, lambda run: shutil.rmtree(run / "checkpoints")),
        ["holds no checkpoint"],
    ),
    (
        "resume-truncated-checkpoint",
        lambda r, t: _resume(
            r, t, lambda run: _truncate(run / "checkpoints" / "step_000001" / "mp_rank_00_model_states.pt")
        ),
        ["step_000001/mp_rank_00_model_states.pt: 100 bytes, the manifest says 1000"],
    ),
    (
        "resume-broken-manifest",
        lambda r, t: _resume(r, t, lambda run: _write(run / "checkpoints" / "step_000001" / "manifest.json", "{")),
        ["manifest.json: unreadable"],
    ),
    (
        "resume-broken-latest-only-checkpoint-cut",
        lambda r, t: _resume(
            r,
            t,
            lambda run: (
                _write(run / "checkpoints" / "latest", b"\x00"),
                (run / "checkpoints" / "step_000001" / "trainer_state.json").unlink(),
            ),
        ),
        ["latest: names", "no other complete checkpoint"],
    ),
    (
        "resume-config-yaml-broken",
        lambda r, t: _resume(r, t, lambda run: _write(run / "config.yaml", "run: [\n")),
        ["config.yaml line 2 column 1: invalid YAML"],
    ),
    (
        "resume-config-bad-field",
        lambda r, t: _resume(r, t, lambda run: _write(run / "config.yaml", "run:\n  stepz: 3\n")),
        ["run.stepz: Extra inputs"],
    ),
    (
        "resume-finished-run",
        lambda r, t: _resume(r, t, lambda run: _write(run / "config.yaml", "run:\n  steps: 1\n")),
        ["the run has trained its 1 steps (run.steps=1); continue it with --set run.steps=N"],
    ),
    (
        "resume-with-config-flag",
        lambda r, t: (["train", "--config", r / "c.yaml", "--resume", _fake_run(r, t)], r / "runs" / "old"),
        ["--resume continues a run with its saved config"],
    ),
    # --- Redis URLs and secrets
    (
        "redis-url-scheme",
        lambda r, t: (["control", "--redis-url", "http://localhost:6379"], None),
        ["scheme 'http' is not redis"],
    ),
    (
        "redis-url-port",
        lambda r, t: (["control", "--redis-url", "redis://:pw@localhost:99999/0"], None),
        ["Port out of range", "redis://:***@localhost:99999/0"],
    ),
    (
        "redis-url-database",
        lambda r, t: (["control", "--redis-url", "redis://localhost:6379/zero"], None),
        ["database 'zero' is not a number"],
    ),
    (
        "redis-url-file-missing",
        lambda r, t: (["control", "--redis-url-file", r / "url.secret"], None),
        ["--redis-url-file: cannot read", "url.secret"],
    ),
    (
        "redis-url-file-empty",
        lambda r, t: (["control", "--redis-url-file", _write(r / "url.secret", "\n")], None),
        ["url.secret is empty"],
    ),
    # --- a run folder is never overwritten (each with the fast test config: a miss trains quickly, and fails)
    (
        "new-run-over-checkpoints-without-latest",
        lambda r, t: _new_run_over(r, t, lambda run: (run / "checkpoints" / "latest").unlink()),
        ["old already holds a run (checkpoints up to step_000001); resume it with `stare train --resume"],
    ),
    (
        "new-run-over-checkpoints",
        lambda r, t: _new_run_over(r, t, None),
        ["old already holds a run", "--resume", "or choose another run.name"],
    ),
    # --- configs that would train the wrong thing silently
    (
        "resume-empty-config",
        lambda r, t: _resume(r, t, lambda run: _write(run / "config.yaml", "")),
        ["config.yaml: empty (no settings); restore it from a backup"],
    ),
    (
        "resume-empty-config-restored-from-the-checkpoint",
        lambda r, t: _resume(r, t, lambda run: _empty_config_with_copy(run)),
        ["config.yaml: empty (no settings); restore it from the newest checkpoint: cp ", "step_000001/config.yaml"],
    ),
    (
        "resume-no-config-beside-checkpoints",
        lambda r, t: _resume(r, t, lambda run: (run / "config.yaml").unlink()),
        ["no config.yaml there; restore it from a backup"],
    ),
    (
        "config-empty",
        lambda r, t: _fast_new(r, t, "--config", _write(r / "c.yaml", "")),
        ["c.yaml: empty (no settings); write the fields to change, or drop --config"],
    ),
    (
        "config-comments-only",
        lambda r, t: _fast_new(r, t, "--config", _write(r / "c.yaml", "# run:\n#   steps: 3\n")),
        ["c.yaml: empty (no settings)"],
    ),
    ("optim-lr-inf", lambda r, t: _fast_new(r, t, "--set", "optim.lr=inf"), ["optim.lr: Input should be a finite"]),
    ("optim-lr-nan", lambda r, t: _fast_new(r, t, "--set", "optim.lr=.nan"), ["optim.lr: Input should be a finite"]),
    (
        "optim-lr-1e308",
        lambda r, t: _fast_new(r, t, "--set", "optim.lr=1e308"),
        ["optim.lr: Input should be less than or equal to 1"],
    ),
    (
        "optim-grad-clip-inf",
        lambda r, t: _fast_new(r, t, "--set", "optim.grad_clip=.inf"),
        ["optim.grad_clip: Input should be a finite"],
    ),
    (
        "rollout-temperature-inf",
        lambda r, t: _fast_new(r, t, "--set", "rollout.temperature=.inf"),
        ["rollout.temperature: Input should be a finite"],
    ),
    (
        "optim-beta-one",
        lambda r, t: _fast_new(r, t, "--set", "optim.betas=[0.9, 1.0]"),
        ["optim.betas[1]: Input should be less than 1"],
    ),
    # --- config files named in their errors
    (
        "config-is-a-folder",
        lambda r, t: (["train", "--config", (r / "cfgdir").mkdir() or r / "cfgdir"], None),
        ["cfgdir is a folder, not a YAML file"],
    ),
    (
        "config-is-a-run-folder",
        lambda r, t: (["train", "--config", _fake_run(r, t)], None),
        ["old is a folder, not a YAML file", "to continue the run in it: stare train --resume"],
    ),
    (
        "yaml-unknown-key-names-the-file",
        lambda r, t: (["train", "--config", _write(r / "c.yaml", "optim:\n  lrr: 1\n")], None),
        [
            "optim.lrr: Extra inputs are not permitted (got 1, in ",
            "c.yaml); did you mean optim.lr?",
            "fix the value in ",
        ],
    ),
    (
        "yaml-wrong-type-names-the-file",
        lambda r, t: (["train", "--config", _write(r / "c.yaml", "run:\n  steps: many\n")], None),
        ["run.steps: Input should be a valid integer", "(got 'many', in ", "c.yaml)"],
    ),
    # --- what the model and the machine allow, before anything starts
    (
        "max-new-tokens-beyond-the-context",
        lambda r, t: _fast_new(r, t, "--set", "rollout.max_new_tokens=200"),
        ["rollout.max_new_tokens=200 leaves no room for a prompt in the model's context of 128 tokens"],
    ),
    (
        "max-prompt-and-new-tokens-beyond-the-context",
        lambda r, t: _fast_new(r, t, "--set", "data.max_prompt_len=100", "--set", "rollout.max_new_tokens=40"),
        ["data.max_prompt_len=100 + rollout.max_new_tokens=40 = 140 tokens exceed the model's context of 128"],
    ),
    (
        "threads-beyond-the-machine",
        lambda r, t: _fast_new(r, t, "--set", f"run.threads={usable_cpus() + 1}"),
        [f"run.threads={usable_cpus() + 1}: this machine lets stare run on {usable_cpus()} CPUs"],
    ),
    (
        "threads-absurd",
        lambda r, t: _fast_new(r, t, "--set", "run.threads=100000"),
        ["run.threads: Input should be less than or equal to 4096"],
    ),
]


def _model_args(root: Path, tiny: Path, change) -> tuple[list, None]:
    return (
        ["train", "--set", f"model.path={_model(tiny, root, change)}", "--set", f"run.output_dir={root / 'runs'}"],
        root / "runs" / "tiny-stare",
    )


def _data_args(root: Path, tiny: Path, content, name: str = "data.jsonl") -> list:
    path = root / name
    if content is not None:
        _write(path, content)
    return [
        "train",
        "--no-progress",
        "--set",
        "task.name=dataset",
        "--set",
        f"task.path={path}",
        "--set",
        f"model.path={tiny}",
        "--set",
        f"run.output_dir={root / 'runs'}",
        "--set",
        "run.name=d",
        "--set",
        "control_plane.serve_in_train=false",
    ]


def _resume(root: Path, tiny: Path, damage) -> tuple[list, Path]:
    run = _fake_run(root, tiny, damage)
    return ["train", "--no-progress", "--resume", run], run


def _fast(root: Path, tiny: Path, name: str = "x") -> list:
    """The fast test config as flags (a case that is not refused trains two tiny steps, then fails)."""
    return ["--no-progress", "--set", "control_plane.serve_in_train=false"] + [
        w for o in fast_override_list(tiny, root / "runs") + [f"run.name={name}"] for w in ("--set", o)
    ]


def _fast_new(root: Path, tiny: Path, *extra) -> tuple[list, Path]:
    """A new run `x` with the fast config and `extra` flags; its folder must not be left behind."""
    return ["train", *_fast(root, tiny), *extra], root / "runs" / "x"  # extra last: its --set wins


def _new_run_over(root: Path, tiny: Path, damage) -> tuple[list, Path]:
    """A new run named like an existing one (`_fake_run`, changed by `damage`)."""
    run = _fake_run(root, tiny, damage)
    return ["train", *_fast(root, tiny, name="old")], run


def _empty_config_with_copy(run: Path) -> None:
    """config.yaml emptied, the copy every checkpoint keeps (learner.step.trainer.Learner.save) still there."""
    _write(run / "checkpoints" / "step_000001" / "config.yaml", (run / "config.yaml").read_text())
    _write(run / "config.yaml", "")


def test_the_table_covers_at_least_25_distinct_mistakes():
    assert len({c[0] for c in CASES}) == len(CASES) >= 25


@pytest.mark.parametrize("argv_of, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_mistake_is_one_message_with_exit_2(tmp_path, tiny_model_dir, capsys, argv_of, expected):
    argv, watched = argv_of(tmp_path, tiny_model_dir)
    before = _snapshot(watched) if watched is not None else None
    existed = watched is not None and watched.exists()
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    assert err.startswith("stare: ") and all(e in err for e in expected), err
    if watched is not None:
        assert watched.exists() == existed  # a failed new run leaves no folder
        assert _snapshot(watched) == before  # a failed resume changes nothing


@pytest.mark.parametrize("resume", [False, True], ids=["new-run", "resume"])
def test_a_run_folder_in_use_is_one_message_naming_its_holder(tmp_path, tiny_model_dir, capsys, resume):
    """A second writer is refused with the holder's pid, host, command and start; a resume is not told to
    pick another run.name (it is this run it wants)."""
    import os
    import socket

    from stare.runtime.run_lock import RunLock

    run = _fake_run(tmp_path, tiny_model_dir) if resume else tmp_path / "runs" / "fresh"
    argv = (
        ["train", "--no-progress", "--resume", run] if resume else ["train", *_fast(tmp_path, tiny_model_dir, "fresh")]
    )
    with RunLock(run, command="stare up --config up.yaml"):
        before = _snapshot(run)
        code = main([str(a) for a in argv])
        assert _snapshot(run) == before
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    first = err.splitlines()[0]
    assert first.startswith(f"stare: run folder {run} is in use by pid {os.getpid()} on host {socket.gethostname()} ")
    assert "(stare up --config up.yaml, since 20" in first and f"kill -TERM {os.getpid()}" in first
    assert first.endswith("or choose another run.name") != resume


def test_debug_shows_the_traceback_of_a_mapped_mistake(tmp_path):
    from stare.config import ConfigError

    with pytest.raises(ConfigError, match="does not exist"):
        main(["train", "--debug", "--config", str(tmp_path / "nope.yaml")])


def test_an_unexpected_error_keeps_its_traceback(monkeypatch):
    import stare.app.cli.parser

    def broken(args):
        raise KeyError("a bug")

    monkeypatch.setattr(stare.app.cli.parser, "build_parser", _parser_with(stare.app.cli.parser.build_parser, broken))
    with pytest.raises(KeyError, match="a bug"):
        main(["train"])


def _parser_with(build, fn):
    def build_with():
        parser = build()
        for action in parser._subparsers._group_actions:
            action.choices["train"].set_defaults(fn=fn)
        return parser

    return build_with


def test_a_run_that_trained_nothing_exits_3_with_its_reason_and_no_traceback(monkeypatch, capsys):
    import stare.app.cli.parser
    from learner.loop.run_outcome import NothingTrained

    def nothing(args):
        raise NothingTrained("runs/x: no input to train on: all 4 groups ... were dead-lettered")

    monkeypatch.setattr(stare.app.cli.parser, "build_parser", _parser_with(stare.app.cli.parser.build_parser, nothing))
    assert main(["train"]) == 3
    err = capsys.readouterr().err
    assert (
        err
        == "stare: the run trained nothing useful: runs/x: no input to train on: all 4 groups ... were dead-lettered\n"
    )


@pytest.mark.redis
def test_a_wrong_redis_password_is_one_message_naming_the_fix(tmp_path):
    from redis_fixtures import have_redis_server, redis_server

    from stare.app.cli.errors import explain
    from stare.runstate.redis_state import RedisRunState
    from stare.transport.redis_secrets import with_password

    if not have_redis_server():
        pytest.skip("redis-server is not on PATH")
    with redis_server(tmp_path / "r") as server:
        state = RedisRunState.connect(with_password(server.url, "wrong-password"), "run", socket_timeout_s=2.0)
        with pytest.raises(Exception) as caught:
            state.status()
        state.close()
    code, message = explain(caught.value)
    assert code == 2 and message.startswith("Redis refused the password (") and "STARE_REDIS_PASSWORD_FILE" in message
