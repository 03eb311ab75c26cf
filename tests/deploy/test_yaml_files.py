"""Every shipped YAML file parses: configs, docker-compose.yml, deploy/ (k8s, Ray). The configs are
also loaded as run configs by tests/test_config.py; here every document must be a mapping."""

from __future__ import annotations

import pytest
import yaml
from deploy_helpers import REPO

YAML_FILES = sorted(
    {
        *REPO.glob("configs/**/*.yaml"),
        *REPO.glob("deploy/**/*.yaml"),
        *REPO.glob("deploy/**/*.yml"),
        REPO / "docker-compose.yml",
    }
)


def test_the_deployment_files_are_found():
    names = {p.relative_to(REPO).as_posix() for p in YAML_FILES}
    assert {
        "docker-compose.yml",
        "configs/gpu-node.yaml",
        "deploy/k8s/base/kustomization.yaml",
        "deploy/ray/raycluster.yaml",
    } <= names


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_yaml_file_parses(path):
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert docs and all(isinstance(d, dict) for d in docs)


def test_a_broken_yaml_file_does_not_parse(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("services:\n  a: [1, 2\n")
    with pytest.raises(yaml.YAMLError):
        list(yaml.safe_load_all(bad.read_text()))
