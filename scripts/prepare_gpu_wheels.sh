#!/usr/bin/env bash
# Wheels for scripts/doctor.sh, prepared here (with network) for a GPU machine without it.
#
#   scripts/prepare_gpu_wheels.sh            # -> .whl/*.whl and .whl/stare/stare-*.whl (git-ignored)
#
# The GPU machine is expected to have Python 3.12 (x86_64, manylinux) with CUDA torch, transformers
# (and its huggingface-hub), accelerate, tokenizers, safetensors, numpy, pyyaml, rich, tensorboard, matplotlib,
# packaging, tqdm and setuptools, and nothing else of ours: no DeepSpeed, vLLM, pydantic, redis or peft. This
# fetches what the learner, `stare train` and `stare doctor` import beyond that (not vLLM: 326 MB), at the
# versions this checkout's environment runs
# (PYTHON, default .venv/bin/python), with each one's Requires-Dist checked below:
#   deepspeed    einops hjson msgpack ninja numpy packaging psutil py-cpuinfo pydantic torch tqdm
#   pydantic     annotated-types pydantic-core typing-extensions typing-inspection
#   redis        (none on Python >= 3.10)
#   peft         accelerate huggingface-hub numpy packaging psutil pyyaml safetensors torch tqdm transformers
# DeepSpeed is an sdist on the registry: `pip wheel --no-deps` builds a pure-Python wheel (its ops
# are JIT-compiled on use; the learner uses torch's AdamW and needs none). stare's own wheel goes to
# .whl/stare/, used by scripts/gpu_site.sh only where it cannot build stare from the tree.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
OUT=${STARE_WHEELS:-.whl}
TARGET_PY=${STARE_WHEELS_PYTHON:-3.12}  # the GPU machine's Python, X.Y[.Z] (3.12 on the lent H200s)

version() { "$PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1"; }

BINARY=(pydantic pydantic-core annotated-types typing-extensions typing-inspection redis hjson einops
        msgpack ninja psutil py-cpuinfo peft)
pins=()
for name in "${BINARY[@]}"; do pins+=("$name==$(version "$name")"); done
ds="deepspeed==$(version deepspeed)"

rm -rf "$OUT"
mkdir -p "$OUT/stare"
# manylinux_2_N: pip matches N exactly, so name the ones these packages publish.
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64 any; do
  platforms+=(--platform "$p")
done
timeout 600 "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$TARGET_PY" --implementation cp \
  "${platforms[@]}" -d "$OUT" "${pins[@]}"
timeout 900 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$OUT" "$ds"
timeout 600 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$OUT/stare" .

# Each Requires-Dist of what we carry is carried too, or on the GPU machine's list above.
"$PY" - "$OUT" "$TARGET_PY" <<'PY'
import re, sys, zipfile
from pathlib import Path

from packaging.requirements import Requirement

out = Path(sys.argv[1])
there = {"torch", "numpy", "packaging", "tqdm", "transformers", "huggingface-hub", "accelerate", "tokenizers",
         "safetensors", "pyyaml", "rich",
         "tensorboard", "matplotlib", "setuptools"}
py = sys.argv[2]  # X.Y or X.Y.Z
target = {"python_version": ".".join(py.split(".")[:2]), "python_full_version": py if py.count(".") == 2 else f"{py}.0", "sys_platform": "linux", "os_name": "posix",
          "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
          "platform_python_implementation": "CPython", "extra": ""}
norm = lambda s: re.sub(r"[-_.]+", "-", s).lower()
carried = {norm(w.name.split("-")[0]) for w in out.glob("*.whl")}
missing = []
for wheel in out.glob("*.whl"):
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        for line in z.read(meta).decode().splitlines():
            if not line.startswith("Requires-Dist:"):
                continue
            req = Requirement(line.split(":", 1)[1].strip())
            if req.marker is not None and not req.marker.evaluate(target):
                continue  # an extra, or a backport for another Python
            if norm(req.name) not in carried | there:
                missing.append(f"{wheel.name}: {req}")
if missing:
    sys.exit("not carried and not on the GPU machine:\n  " + "\n  ".join(missing))
print(f"{len(carried)} wheels in {out}/ ({sum(w.stat().st_size for w in out.rglob('*.whl')) / 2**20:.1f} MiB)")
PY
