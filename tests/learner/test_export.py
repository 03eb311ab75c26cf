"""`stare export`: a learner checkpoint -> a Hugging Face directory whose logits are the learner's."""

import json

import pytest
import torch
from train_helpers import step_trajectories as _trajectories

from learner.engine.export import ExportError, checkpoint_tag, export_checkpoint
from stare.config import build_config


@pytest.fixture
def trained(tiny_model_dir, tmp_path, request):
    """A learner after one real step (lr 1e-2) and its checkpoint under tmp_path/checkpoints."""
    from transformers import AutoTokenizer

    from learner.step.trainer import Learner

    cfg = build_config(
        {},
        overrides=[
            f"model.path={tiny_model_dir}",
            f"run.output_dir={tmp_path}",
            "rollout.prompts_per_step=2",
            "rollout.samples_per_prompt=2",
            "optim.micro_batch=4",
            "optim.lr=1e-2",
            f"optim.zero_stage={request.param}",
            "diagnostics.predicted_entropy_change=false",
        ],
    )
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    learner = Learner(cfg, tiny_model_dir, pad_id=tok.pad_token_id or 0)
    metrics = learner.train_step(_trajectories(len(tok)))
    assert metrics["grad_norm"] > 0
    ckpt = tmp_path / "checkpoints"
    ckpt.mkdir()
    learner.save(ckpt, {})
    return learner, ckpt


@pytest.mark.parametrize("trained", [1, 3], indirect=True, ids=["zero1", "zero3"])
def test_exported_model_gives_the_learners_logits(trained, tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    learner, ckpt = trained
    out = export_checkpoint(ckpt, tmp_path / "hf", model_path=tiny_model_dir)
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer_config.json"} <= {
        p.name for p in out.iterdir()
    }
    assert json.loads((out / "export_info.json").read_text())["step"] == 1
    exported = AutoModelForCausalLM.from_pretrained(out).eval()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    ids = torch.tensor([[3, 5, 7, 9, 4, 6, 8, 10]])
    with torch.no_grad():
        learner.engine.module.eval()
        want = learner.engine.module(input_ids=ids).logits
        got = exported(input_ids=ids).logits
        assert torch.allclose(got, want, atol=1e-5, rtol=0)
        assert not torch.allclose(base(input_ids=ids).logits, want, atol=1e-3)  # the step moved the weights


def test_export_of_a_missing_step_names_the_steps_the_run_has(tmp_path):
    (tmp_path / "step_000004").mkdir()
    with pytest.raises(ExportError, match=r"--step 3: .*step_000004"):
        checkpoint_tag(tmp_path, 3)
    with pytest.raises(ExportError, match="no 'latest' file"):
        checkpoint_tag(tmp_path / "nothing", None)


@pytest.mark.parametrize("trained", [1], indirect=True, ids=["zero1"])
def test_stare_export_command_writes_the_step_asked_for(trained, tmp_path, capsys):
    import yaml

    from stare.app.cli import main

    learner, ckpt = trained
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(learner.cfg.model_dump(mode="json")))
    assert main(["export", str(tmp_path), "--step", "1", "--out", str(tmp_path / "out")]) == 0
    assert json.loads((tmp_path / "out" / "export_info.json").read_text())["step"] == 1
    assert main(["export", str(tmp_path), "--step", "7"]) == 1
    assert "--step 7: no checkpoint" in capsys.readouterr().err


@pytest.mark.parametrize("trained", [1], indirect=True, ids=["zero1"])
def test_a_finished_run_exports_any_of_its_checkpoints_without_resume_checks(trained, tmp_path, capsys):
    import shutil

    import yaml

    from stare.app.cli import main

    learner, ckpt = trained
    finished = learner.cfg.model_dump(mode="json")
    finished["run"]["steps"] = 1  # the run trained all its steps: a resume would be refused, an export is not
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(finished))
    assert main(["export", str(tmp_path), "--step", "1", "--out", str(tmp_path / "one")]) == 0
    assert main(["export", str(tmp_path), "--out", str(tmp_path / "latest")]) == 0
    assert json.loads((tmp_path / "latest" / "export_info.json").read_text())["step"] == 1
    # a checkpoint still being written (no manifest yet) is refused, by name; the whole ones stay exportable
    shutil.copytree(ckpt / "step_000001", ckpt / "step_000002", ignore=shutil.ignore_patterns("manifest.json"))
    capsys.readouterr()
    assert main(["export", str(tmp_path), "--step", "2", "--out", str(tmp_path / "two")]) == 1
    assert "step_000002 is not a whole checkpoint" in capsys.readouterr().err and not (tmp_path / "two").exists()


def test_the_rollout_state_is_a_copy_that_a_later_step_does_not_change():
    """full_state_dict hands the publisher CPU copies: under ZeRO 0-2 the module's parameters live
    on, and the next step (or a background publish still sending) must not see one in the other."""
    import torch

    from learner.engine.host_snapshot import host_copy

    param = torch.nn.Parameter(torch.ones(3))
    copy = host_copy(param)
    with torch.no_grad():
        param.add_(1.0)
    assert torch.equal(copy, torch.ones(3)) and not copy.requires_grad
    assert copy.untyped_storage().data_ptr() != param.untyped_storage().data_ptr()
