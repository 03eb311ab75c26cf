#!/usr/bin/env bash
# `stare doctor` on a GPU machine without network (docs/deploy.md, "First on a GPU node: `stare doctor`"):
#
#   scripts/prepare_gpu_wheels.sh     # once, on a machine with network: wheels into .whl/
#   scripts/doctor.sh [ARGS]          # on the GPU machine; ARGS go to `stare doctor` (--config RUN.yaml, --only ...)
#
# Installs the carried wheels and stare into a private folder on PYTHONPATH (scripts/gpu_site.sh), then runs the
# doctor: its table on stdout, doctor.json and the checks' logs in $OUT (default ./doctor-out). Where vLLM is not
# installed (the lent GPU images: its wheel is too large to carry) the vLLM checks are skipped, saying so.
# STARE_DOCTOR_BENCH=1: then also `stare bench gpu --quick` (learner MFU, chunked log-prob memory, generation)
# into $OUT/bench-gpu.json. Exit status: the doctor's (1 when a check failed).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_site.sh
gpu_site_install doctor
export OUT=${OUT:-$PWD/doctor-out}
cd /  # import stare from $SITE, not from the source folder
"$PY" -c "import deepspeed, pydantic, redis, stare.app.cli"  # fail here, clearly, if anything is missing
status=0
timeout --kill-after=15 "${STARE_DOCTOR_LIMIT_S:-600}" "$PY" -m stare.app.cli doctor --out "$OUT" "$@" || status=$?
if [ "${STARE_DOCTOR_BENCH:-0}" = 1 ]; then  # the GPU section of the performance suite (docs/performance.md)
  timeout --kill-after=15 "${STARE_DOCTOR_BENCH_LIMIT_S:-300}" "$PY" -m stare.app.cli bench gpu --quick \
    --json "$OUT/bench-gpu.json" || echo "doctor: stare bench gpu failed (exit $?)" >&2
fi
exit "$status"
