#!/usr/bin/env bash
# The GPU smoke test in one command, on one GPU, offline, in under 8 minutes (an H200):
#
#   scripts/prepare_gpu_wheels.sh     # once, on a machine with network: wheels into .whl/
#   scripts/gpu_smoke.sh [ARGS]       # on the GPU machine; ARGS go to scripts/gpu_smoke.py
#
# Needs python3 with CUDA torch, transformers and the rest of prepare_gpu_wheels.sh's list; installs
# the carried wheels (DeepSpeed, pydantic, redis, ...) and stare itself into a private folder
# (STARE_SMOKE_SITE, default /tmp/stare-smoke-site) on PYTHONPATH, then runs scripts/gpu_smoke.py:
# 3 learner steps of 64 x 4,096-token sequences on a random Qwen2.5-1.5B-shaped model (bf16, gradient
# checkpointing, chunked log-probs), then 5 steps of `stare train`. It prints peak memory, tokens/s
# and MFU, the weight publish from the device and from the host (pass --zero-stage 3 for the ZeRO-3
# learner: its head gathered once per micro-batch), and writes gpu_smoke.json to --out (default: $OUT,
# else ./gpu-smoke-out). STARE_SMOKE_BENCH=1:
# then also `stare bench gpu --quick` (learner MFU, chunked log-prob memory, HF generation) into bench-gpu.json.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WHEELS=${STARE_WHEELS:-.whl}
SITE=${STARE_SMOKE_SITE:-/tmp/stare-smoke-site}
LIMIT_S=${STARE_SMOKE_LIMIT_S:-480}

if ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  echo "gpu_smoke: no wheels in $WHEELS/; run scripts/prepare_gpu_wheels.sh where there is network" >&2
  exit 2
fi
start=$(date +%s)
rm -rf "$SITE"
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$WHEELS"/*.whl
# stare from this tree (the code under test); the prepared wheel where setuptools is missing
if ! "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --no-build-isolation \
      --target "$SITE" . 2>/dev/null; then
  echo "gpu_smoke: cannot build stare here; installing the prepared $WHEELS/stare/ wheel" >&2
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$WHEELS"/stare/*.whl
fi
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
echo "gpu_smoke: installed in $(( $(date +%s) - start )) s"
script=$PWD/scripts/gpu_smoke.py
export OUT=${OUT:-$PWD/gpu-smoke-out}  # gpu_smoke.py's default --out
cd /  # import stare from $SITE, not from the source folder (its roles live outside stare/)
"$PY" -c "import deepspeed, pydantic, redis, learner.step.trainer"  # fail here, clearly, if anything is missing
timeout --kill-after=15 "$LIMIT_S" "$PY" "$script" "$@"
if [ "${STARE_SMOKE_BENCH:-0}" = 1 ]; then  # the GPU section of the performance suite (docs/performance.md)
  timeout --kill-after=15 "${STARE_SMOKE_BENCH_LIMIT_S:-300}" "$PY" -m stare.app.cli bench gpu --quick \
    --json "$OUT/bench-gpu.json" || echo "gpu_smoke: stare bench gpu failed (exit $?)" >&2
fi
echo "gpu_smoke: done in $(( $(date +%s) - start )) s"
