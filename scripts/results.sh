#!/usr/bin/env bash
# Regenerate docs/results.md and its figures: every algorithm (and the controller variants) on the
# tiny config, SEEDS seeds each, then `python -m stare.app.report.results` over what completed.
#
#   scripts/results.sh            sweep (runs only what is missing) then report
#   scripts/results.sh sweep      only the runs;   scripts/results.sh report   only the report
#
# Environment: RUNS_DIR (runs/results), RECORDS (docs/results/runs), SEEDS ("0 1 2 3 4"), JOBS (2
# runs at once), VARIANTS (all below, in this order), NICE (5), SETS (--set overrides for every run,
# space separated), RUN_TIMEOUT (3600 s a run), FINAL_K (64: samples per held-out problem in each run's
# final evaluation, task.final_eval_k; pass@k up to 64 comes from them by the unbiased estimator, so 128
# halves the evaluation's noise), JOBLIST (a file of lines as `scripts/results.sh list` prints them:
# the sweep runs those, in that order, instead of the list VARIANTS and SEEDS give).
# A run is one process group with the sweep (`timeout --foreground`), so stopping the sweep's group
# (kill -STOP -PGID ... kill -CONT -PGID) pauses and resumes every run at once; RUN_TIMEOUT counts the pause.
# The longer-horizon study (docs/results.md), first protocol (5 seeds, final n = 64; docs/results/long):
#   RUNS_DIR=runs/long RECORDS=docs/results/long VARIANTS="stare grpo" RUN_TIMEOUT=10800 \
#     SETS="run.steps=1500 task.eval_every=100 task.eval_k=64 run.checkpoint_every=250" scripts/results.sh sweep
# and its second protocol (all on one machine fingerprint, final n = 128, so seeds 0-4 of stare and grpo are
# rerun too): seeds 0-4 of stare, grpo, dapo and stare-paper first, then stare and grpo seeds 5-9, then dapo and
# stare-paper seeds 5-9, seed by seed so that a sweep cut short leaves paired sets (a JOBLIST in that order;
# RUN_TIMEOUT large as pauses count against it):
#   export RUNS_DIR=runs/long2 RECORDS=docs/results/long2 FINAL_K=128 JOBS=2 NICE=19 RUN_TIMEOUT=86400 \
#     SETS="run.steps=1500 task.eval_every=100 task.eval_k=64 run.checkpoint_every=250"
#   { for s in 0 1 2 3 4; do VARIANTS="stare grpo dapo stare-paper" SEEDS=$s scripts/results.sh list; done
#     VARIANTS="stare grpo" SEEDS="5 6 7 8 9" scripts/results.sh list
#     VARIANTS="dapo stare-paper" SEEDS="5 6 7 8 9" scripts/results.sh list; } >long2.jobs
#   JOBLIST=long2.jobs scripts/results.sh sweep
# Several updates per batch (tier 4: the baselines with optim.mini_batches as in their papers, and
# grpo with one update per batch on the same machine, so that every difference pairs):
#   RUNS_DIR=runs/mb RECORDS=docs/results/mb VARIANTS="grpo kl-cov-mb clip-cov-mb dapo-mb" scripts/results.sh sweep
# SmolLM2-135M-Instruct, STARE (the paper's fixed W 1.1, and the tiny config's adaptive controller) against GRPO
# (3 seeds, dynamic sampling off for both, as the tiny sweep):
#   CONFIG=configs/smollm2-cpu.yaml RUNS_DIR=runs/smollm2 RECORDS=docs/results/smollm2 SEEDS="0 1 2" \
#     VARIANTS="stare grpo stare-adaptive" JOBS=2 RUN_TIMEOUT=5400 SETS="run.steps=12 task.eval_every=4 \
#     run.checkpoint_every=1000 run.threads=1 data.dynamic_sampling=false task.eval_problems=32" scripts/results.sh sweep
# A run is done when its record
# $RECORDS/<run>.json exists: the report reads only the records (a few KB each, kept in git), so a
# sweep longer than one sitting goes on where the last one stopped, on any machine (each record
# carries its machine's fingerprint). A completed run folder without a record is recorded; an
# incomplete one is started again from scratch. Each run's load average at start and end goes to
# $RUNS_DIR/<run>/load.txt and its record (the machine is shared: wall times depend on it).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
PYFLAGS=${PYFLAGS:-}
RUNS_DIR=${RUNS_DIR:-runs/results}
RECORDS=${RECORDS:-docs/results/runs}
SEEDS=${SEEDS:-"0 1 2 3 4"}
JOBS=${JOBS:-2}
NICE=${NICE:-5}
CONFIG=${CONFIG:-configs/tiny-cpu.yaml}
SETS=${SETS:-}
RUN_TIMEOUT=${RUN_TIMEOUT:-3600}
FINAL_K=${FINAL_K:-64}
JOBLIST=${JOBLIST:-}
# tier|label|algo|extra --set overrides (space separated). The labels are the records' names and keep their
# meaning: `grpo` rows run `--algo grpo-matched` (GRPO on the config's clip range 0.2/0.28: STARE without its
# reweighting; `--algo grpo` is vanilla GRPO, clip 0.2/0.2, since), `dapo` rows `--algo dapo-no-overlong`
# (`--algo dapo` adds DAPO's overlong punishment since), so a rerun reproduces the recorded studies. Tiers run in order, seeds interleaved
# within a tier: the headline pair and the controller without its EMA first, then the other
# baselines, then STARE variants that look for where its accuracy cost comes from.
ALL_VARIANTS=(
  "1|stare|stare|"
  "1|grpo|grpo-matched|"
  "1|stare-pctl|stare|controller.ema=0.0"
  "2|grpo-ds|grpo-ds|"
  "2|dapo|dapo-no-overlong|"
  "2|entropy-bonus|entropy-bonus|"
  "2|clip-cov|clip-cov|"
  "2|kl-cov|kl-cov|"
  "2|80-20|80-20|"
  "3|stare-w3|stare|controller.w_max=3.0 controller.m_min=0.5"
  "3|stare-o1|stare|loss.variant=O1"
  "3|stare-lowtarget|stare|controller.target=0.2 controller.band=[0.15,0.25]"
  # Several updates per batch, as the baselines' papers ran them, scaled to 16 prompts a batch. DAPO
  # (Yu et al. 2025; verl recipe/dapo: train_prompt_bsz 512, train_prompt_mini_bsz 32, one epoch):
  # 16 updates per batch, i.e. one prompt's group each. Clip-Cov and KL-Cov (Cui et al. 2025; verl
  # recipe/entropy 7b_clip_cov.sh, 7b_kl_cov.sh: train_prompt_bsz 256, train_prompt_mini_bsz 32):
  # 8 updates per batch, two groups each. grpo-mb: GRPO cut as Clip-Cov/KL-Cov are, the control that
  # tells their covariance rules from the mini-batches themselves.
  "4|kl-cov-mb|kl-cov|optim.mini_batches=8"
  "4|clip-cov-mb|clip-cov|optim.mini_batches=8"
  "4|dapo-mb|dapo-no-overlong|optim.mini_batches=16"
  "5|grpo-mb|grpo-matched|optim.mini_batches=8"
  # the same with lr / 8: eight Adam steps a batch at the one-update lr 3e-4 collapse every -mb run
  # above (docs/results-notes.md); lr 3.75e-5 moves each batch about as far as one update at 3e-4
  "5|kl-cov-mb-lr8|kl-cov|optim.mini_batches=8 optim.lr=3.75e-5"
  "5|grpo-mb-lr8|grpo-matched|optim.mini_batches=8 optim.lr=3.75e-5"
  # the tiny config's controller (C2, W and M proportional to the entropy error, W up to 10, M down to 0.1,
  # entropy smoothed by an EMA) at the paper's target 0.3: what held entropy on the tiny model, tried on a
  # real model (the SmolLM2 study, docs/results-notes.md); on the tiny config it differs from `stare` only
  # by its target and band
  "6|stare-adaptive|stare|loss.variant=C2 controller.target=0.3 controller.band=null controller.adaptive=true controller.schedule=proportional controller.gain=10.0 controller.ema=0.8 controller.w_max=10.0 controller.m_min=0.1"
  # the paper's own STARE settings in place of the tiny config's tuned controller (C2, top 5%, adaptive
  # proportional W up to 10, EMA 0.8, target 0.24 in band [0.17, 0.31]): Luo et al., STARE, reference recipe
  # hp-luo/STARE run_short_cot_qwen2.5_math_7b_STARE.sh (configs/paper/short-cot-qwen2.5-math-7b-stare.yaml):
  # variant O1, P = 0.1, fixed W = 1.1, gate at target entropy 0.3 with no band, adaptive off (so no EMA);
  # the surrogate (eps 0.2/0.28, aggregation) stays the tiny config's, as for every other label
  "6|stare-paper|stare|loss.variant=O1 loss.top_fraction=0.1 controller.w=1.1 controller.adaptive=false controller.target=0.3 controller.band=null controller.ema=0.0"
)
if [[ -n "${VARIANTS:-}" ]]; then read -r -a WANT <<<"$VARIANTS"; else WANT=(); fi

jobs_list() {  # one line per run, "name|algo|overrides", in tier, seed, listed order (or JOBLIST's lines)
  local v tier label algo extra seed i
  if [[ -n "$JOBLIST" ]]; then grep -v '^[[:space:]]*$' "$JOBLIST"; return; fi
  for seed in $SEEDS; do
    i=0
    for v in "${ALL_VARIANTS[@]}"; do
      i=$((i + 1))
      IFS='|' read -r tier label algo extra <<<"$v"
      if ((${#WANT[@]})) && [[ " ${WANT[*]} " != *" $label "* ]]; then continue; fi
      printf '%s %s %s|s%s-%s|%s|%s\n' "$tier" "$seed" "$i" "$seed" "$label" "$algo" "$extra"
    done
  done | sort -n -k1,1 -k2,2 -k3,3 | cut -d'|' -f2-
}

complete() {  # the run's final evaluation (after run.steps, n = FINAL_K) is in its eval.jsonl (the test the
  # record makes, so a run stopped after a periodic evaluation with eval_k = FINAL_K is not taken for done)
  [[ -f "$1/eval.jsonl" ]] && "$PY" ${PYFLAGS:-} -c 'import sys; from pathlib import Path
from stare.app.report.records import _final_eval
e = _final_eval(Path(sys.argv[1])); sys.exit(0 if e and e.get("k") == int(sys.argv[2]) else 1)' "$1" "$FINAL_K"
}

record() {  # the run folder's record into $RECORDS (what the report reads)
  "$PY" ${PYFLAGS:-} -m stare.app.report.results --record "$1" --records "$RECORDS"
}

run_one() {
  local line=$1 name algo extra dir
  IFS='|' read -r name algo extra <<<"$line"
  dir="$RUNS_DIR/$name"
  if [[ -f "$RECORDS/$name.json" ]]; then return 0; fi
  if complete "$dir"; then record "$dir"; return 0; fi
  rm -rf "$dir"
  mkdir -p "$dir"
  local seed=${name#s}
  seed=${seed%%-*}
  local sets=(--set "run.output_dir=$RUNS_DIR" --set "run.name=$name" --set "run.seed=$seed")
  for o in $SETS $extra; do sets+=(--set "$o"); done
  echo "start $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)" >"$dir.load.tmp"
  echo "[results] $name ($algo) start $(date -u +%T)"
  # --foreground: the run stays in the sweep's process group (plain timeout gives it a group of its own,
  # which a kill -STOP of the sweep's group would miss)
  if nice -n "$NICE" timeout --foreground "$RUN_TIMEOUT" "$PY" ${PYFLAGS:-} -m stare.app.cli train --config "$CONFIG" --algo "$algo" --no-progress \
      "${sets[@]}" --set "task.final_eval_k=$FINAL_K" >"$RUNS_DIR/$name.log" 2>&1; then
    echo "end $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)" >>"$dir.load.tmp"
    mv "$dir.load.tmp" "$dir/load.txt"
    rm -rf "$dir/checkpoints"  # 300 steps x 9 variants x 5 seeds of optimizer states: not kept
    record "$dir"
    echo "[results] $name done $(date -u +%T)"
  else
    echo "[results] $name FAILED (log: $RUNS_DIR/$name.log)"
  fi
}
export -f run_one complete record
export PY PYFLAGS RUNS_DIR RECORDS NICE CONFIG SETS RUN_TIMEOUT FINAL_K

sweep() {
  mkdir -p "$RUNS_DIR"
  jobs_list | xargs -d '\n' -P "$JOBS" -I{} bash -c 'run_one "$@"' _ {}
}

report() {
  "$PY" ${PYFLAGS:-} -m stare.app.report.results --records "$RECORDS" --out docs/results.md --figures docs/results \
    --notes docs/results-notes.md
}

case "${1:-all}" in
  sweep) sweep ;;
  report) report ;;
  all) start=$(date +%s); sweep; report; echo "[results] wall time $(( $(date +%s) - start )) s" ;;
  list) jobs_list ;;
  *) echo "usage: scripts/results.sh [sweep|report|all|list]" >&2; exit 2 ;;
esac
