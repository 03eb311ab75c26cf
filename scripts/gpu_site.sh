# Sourced by scripts/doctor.sh (not run on its own): on a GPU machine without network,
# install the wheels scripts/prepare_gpu_wheels.sh carried (DeepSpeed, pydantic, redis, ...) and stare from this
# tree into a private folder (STARE_GPU_SITE, default /tmp/stare-gpu-site) and put it on PYTHONPATH. The
# machine brings python3 with CUDA torch and transformers; vLLM is not carried (its wheel is 326 MB).
PY=${PYTHON:-python3}
WHEELS=${STARE_WHEELS:-.whl}
SITE=${STARE_GPU_SITE:-/tmp/stare-gpu-site}

gpu_site_install() {
  local who=$1
  if ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    echo "$who: no wheels in $WHEELS/; run scripts/prepare_gpu_wheels.sh where there is network" >&2
    exit 2
  fi
  local start
  start=$(date +%s)
  rm -rf "$SITE"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$WHEELS"/*.whl
  # stare from this tree (the code under test); the prepared wheel where setuptools is missing
  if ! "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --no-build-isolation \
        --target "$SITE" . 2>/dev/null; then
    echo "$who: cannot build stare here; installing the prepared $WHEELS/stare/ wheel" >&2
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$WHEELS"/stare/*.whl
  fi
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
  echo "$who: installed in $(( $(date +%s) - start )) s"
}
