#!/usr/bin/env bash
# The compose `cpu` profile, really run, end to end, as docs/deploy.md tells a user to run it: the
# commands of its sections "The CPU profile" and "Stopping, killing and restarting a role" are read
# from the page (scripts/doc_commands.py) and run as written (`doc_run`); the one this host cannot
# run as written (the image build: no Docker Hub here) is replaced with the reason printed
# (`doc_replaced`), and the run fails if the page holds a command it neither ran nor replaced
# (tests/deploy/test_compose_guide.py checks the same without Docker):
#
#   scripts/compose_e2e.sh                  # ~10 min here the first time (image build), ~5 min after
#
# Phases (each one's time is printed; any failure prints the containers' logs and exits non-zero):
#   build      the CPU image (deploy/docker/Dockerfile.cpu; Docker's layer cache makes a second run quick)
#   secrets    scripts/make_secrets.sh (the documented command; existing secrets are kept)
#   preflight  scripts/compose_preflight.py --profile cpu: refuses, naming the holder, while another
#              process holds the control port, and creates no container; then passes
#   up         docker compose --profile cpu up -d; every container healthy; ps; GET /v1/status as documented
#   names      every rollout and reward container runs the worker of its own name (stare-e2e-rollout-cpu-2:
#              rollout-cpu-2)
#   steps      the learner's step advances (GET /v1/status with the token)
#   entropy    PATCH /v1/entropy with the token, read back once the learner applied it
#   crash      SIGKILL of the learner container's process: Docker restarts it (on-failure), it
#              resumes at its newest checkpoint, and metrics.jsonl holds every step once
#   kill       docker compose kill learner-cpu (a manual stop): /v1/status says phase "down" within
#              30 s, Docker has not restarted it; docker compose up -d: it resumes, each step once
#   redeploy   docker compose down, then up: the run resumes with the changed target, and the
#              workers take their predecessors' names (no new names in /v1/status)
#   monitoring --profile monitoring: Prometheus scrapes /metrics with the token, target "up"
#   finish     the run finishes: status "finished", the learner exited 0 and is not restarted,
#              rollout and reward workers idle and healthy, nothing restarts for a while
#   down       docker compose down -v; every documented command was run (or replaced, saying why)
#
# It uses a compose project of its own (STARE_E2E_PROJECT, default stare-e2e) on free loopback
# ports, and a compose override (written to a temporary folder) that mounts a copy of
# configs/compose-cpu.yaml with fewer steps (STARE_E2E_STEPS, default 150; checkpoint every 10):
# the shipped files keep their meaning. Traffic stays on this machine (loopback and the docker
# bridge); the image build reaches the package registries only.
#
# Needs: Docker Engine with Compose v2 (`docker compose`), curl, python3. Where no container
# runtime answers, it says so and exits 2. Environment-only preparation of a host without Docker
# Hub access (this project's agent machines): scripts/docker_host_setup.sh (installs Debian's
# docker.io, starts dockerd, installs the Compose v2 plugin, builds local base images
# stare-base/stare-redis/stare-prometheus); this script then uses those images through the compose
# file's image variables (STARE_REDIS_IMAGE, STARE_PROMETHEUS_IMAGE) and the Dockerfile's
# PYTHON_IMAGE, and serves pip's local find-links folder (STARE_E2E_WHEELS, default: pip's
# configured find-links) to the build on 127.0.0.1. Not run by .ci/run (image build ~5 min).
set -euo pipefail
{  # the whole script is one compound command: bash reads it all before running (safe to edit meanwhile)

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
PROJECT=${STARE_E2E_PROJECT:-stare-e2e}
STEPS=${STARE_E2E_STEPS:-150}  # enough that the crash and the redeploy happen mid-run on a quiet machine
CKPT=${STARE_E2E_CHECKPOINT_EVERY:-10}
IMAGE=${STARE_CPU_IMAGE:-stare-cpu:0.1.0}
TIMEOUT=${STARE_E2E_TIMEOUT_S:-600}   # the longest any one phase may wait
T0=$(date +%s)
PHASE_T=$T0
PHASE=start
TIMINGS=()
WHEEL_PID=
HOLDER_PID=

say() { printf '[compose-e2e %4ds] %s\n' "$(( $(date +%s) - T0 ))" "$*" >&2; }
die() { say "FAILED in phase $PHASE: $*"; exit 1; }
phase() {  # end the current phase, start the next
  local now; now=$(date +%s)
  [ "$PHASE" = start ] || { TIMINGS+=("$PHASE $(( now - PHASE_T ))"); say "phase $PHASE: $(( now - PHASE_T )) s"; }
  PHASE=$1; PHASE_T=$now
  [ "$PHASE" = end ] || say "== $PHASE"
}

# ---- a container runtime? --------------------------------------------------------------------------
if ! command -v docker >/dev/null 2>&1 || ! timeout 20 docker info >/dev/null 2>&1; then
  echo "compose_e2e: no container runtime answers ('docker info' failed): install Docker Engine and start it" \
       "(a host without Docker Hub access: scripts/docker_host_setup.sh)" >&2
  exit 2
fi
if ! timeout 20 docker compose version >/dev/null 2>&1; then
  echo "compose_e2e: Docker answers but has no Compose v2 plugin ('docker compose version' failed)" >&2
  exit 2
fi
command -v curl >/dev/null && command -v python3 >/dev/null || { echo "compose_e2e: needs curl and python3" >&2; exit 2; }
WORK=$(mktemp -d /tmp/stare-e2e.XXXXXX)

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
have_image() { docker image inspect "$1" >/dev/null 2>&1; }

export COMPOSE_PROJECT_NAME=$PROJECT
export COMPOSE_FILE="docker-compose.yml:docker-compose.gpus.yml:$WORK/e2e.override.yml"
export COMPOSE_PROFILES=cpu
export STARE_CONTROL_PORT=${STARE_CONTROL_PORT:-$(free_port)}
export STARE_PROMETHEUS_PORT=${STARE_PROMETHEUS_PORT:-$(free_port)}
export STARE_CPU_IMAGE=$IMAGE
# Docker Hub's images where they are present, else the local ones scripts/docker_host_setup.sh builds
have_image redis:7.4.9-alpine || { have_image stare-redis:bookworm && export STARE_REDIS_IMAGE=${STARE_REDIS_IMAGE:-stare-redis:bookworm}; }
have_image prom/prometheus:v3.5.0 || { have_image stare-prometheus:bookworm && export STARE_PROMETHEUS_IMAGE=${STARE_PROMETHEUS_IMAGE:-stare-prometheus:bookworm}; }
API="http://127.0.0.1:$STARE_CONTROL_PORT"
DC=(docker compose)

cleanup() {
  local rc=$?
  [ -n "$WHEEL_PID" ] && kill "$WHEEL_PID" 2>/dev/null || true
  [ -n "$HOLDER_PID" ] && kill "$HOLDER_PID" 2>/dev/null || true
  if [ $rc -ne 0 ] && [ "$PHASE" != build ]; then
    say "container states:"; "${DC[@]}" ps -a >&2 || true
    for id in $("${DC[@]}" --profile monitoring ps -a -q 2>/dev/null); do
      say "logs of $(docker inspect -f '{{.Name}}' "$id" | tr -d /) (last 80 lines):"
      docker logs --tail 80 "$id" 2>&1 | sed 's/^/    /' >&2 || true
    done
  fi
  if [ "${STARE_E2E_KEEP:-0}" != 1 ]; then
    "${DC[@]}" --profile monitoring down -v --remove-orphans >/dev/null 2>&1 || true
  fi
  rm -rf "$WORK"
  exit $rc
}
trap cleanup EXIT

# ---- the tiny run: the shipped cpu config with fewer steps, through a compose override ----------------
sed -e "s/^  steps: .*/  steps: $STEPS/" -e "s/^  checkpoint_every: .*/  checkpoint_every: $CKPT/" \
    -e "s/^  eval_every: .*/  eval_every: $(( STEPS * 2 ))      # no held-out evaluation in the e2e run/" \
    configs/compose-cpu.yaml >"$WORK/stare.yaml"
grep -q "^  steps: $STEPS$" "$WORK/stare.yaml" || die "could not set run.steps in a copy of configs/compose-cpu.yaml"
chmod 0644 "$WORK/stare.yaml"; chmod 0755 "$WORK"
RUN_NAME=$(sed -n 's/^  name: //p' "$WORK/stare.yaml" | head -n1)
{
  echo "services:"
  for s in control-cpu learner-cpu rollout-cpu reward-cpu; do
    printf '  %s:\n    volumes:\n      - %s/stare.yaml:/etc/stare/stare.yaml:ro\n' "$s" "$WORK"
  done
} >"$WORK/e2e.override.yml"

# ---- the documented commands (docs/deploy.md), run as written -----------------------------------------
DOC=docs/deploy.md
DOC_SECTIONS=("The CPU profile" "Stopping, killing and restarting a role")
DOC_LINES=()
for section in "${DOC_SECTIONS[@]}"; do
  lines=$(python3 scripts/doc_commands.py "$DOC" "$section") || die "could not read the commands of $DOC, \"$section\""
  mapfile -t -O "${#DOC_LINES[@]}" DOC_LINES <<<"$lines"
done
: >"$WORK/doc_done"
doc_line() {  # doc_line PREFIX: the documented command that starts with PREFIX (one distinct line)
  local prefix=$1 line found=
  for line in "${DOC_LINES[@]}"; do
    if [[ "$line" == "$prefix"* ]]; then
      [ -z "$found" ] || [ "$found" = "$line" ] || die "two documented commands start with '$prefix'"
      found=$line
    fi
  done
  [ -n "$found" ] || die "$DOC documents no command starting with '$prefix' (the page and this script disagree)"
  printf '%s\n' "$found"
}
doc_run() {  # doc_run PREFIX: run the documented command as written (bash -c, this script's environment)
  local line; line=$(doc_line "$1") || exit 1
  printf '%s\n' "$line" >>"$WORK/doc_done"
  say "\$ $line"
  bash -c "$line"
}
doc_replaced() {  # doc_replaced PREFIX REASON: a documented command this host runs differently
  local line; line=$(doc_line "$1") || exit 1
  printf '%s\n' "$line" >>"$WORK/doc_done"
  say "instead of \`$line\`: $2"
}
doc_all_done() {
  local line missing=()
  for line in "${DOC_LINES[@]}"; do grep -qxF -- "$line" "$WORK/doc_done" || missing+=("$line"); done
  [ ${#missing[@]} -eq 0 ] || die "$DOC documents commands this run did not run: $(printf "'%s' " "${missing[@]}")"
}
doc_phase() { doc_run "curl -s -H" 2>/dev/null | json 'd["phase"]' 2>/dev/null || echo "?"; }  # GET /v1/status as documented

# ---- helpers -----------------------------------------------------------------------------------------
TOKEN_FILE=deploy/secrets/api-token
api() {  # api METHOD PATH [JSON]: the body on stdout; non-2xx fails
  local method=$1 path=$2 body=${3:-}
  curl -fsS --max-time 10 -X "$method" -H "Authorization: Bearer $(cat "$TOKEN_FILE")" \
       ${body:+-H "Content-Type: application/json" --data "$body"} "$API$path"
}
json() { python3 -c "import json, sys; d = json.load(sys.stdin); print(eval(sys.argv[1], {}, {'d': d}))" "$1"; }
status_field() { api GET /v1/status 2>/dev/null | json "$1" 2>/dev/null || echo "?"; }
wait_for() {  # wait_for DESCRIPTION TIMEOUT_S COMMAND...: until COMMAND succeeds
  local what=$1 limit=$2; shift 2
  local until=$(( $(date +%s) + limit ))
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$until" ] || die "timed out after ${limit}s waiting for $what"
    sleep 2
  done
}
container_of() { "${DC[@]}" ps -a -q "$1" | head -n1; }
all_healthy() {  # every container of the project running and healthy
  local ids; ids=$("${DC[@]}" ps -q)
  [ -n "$ids" ] || return 1
  local bad; bad=$(docker inspect -f '{{.Name}} {{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}' $ids \
                   | awk '$2 != "running" || ($3 != "healthy" && $3 != "none")')
  [ -z "$bad" ]
}
step_at_least() { local s; s=$(status_field 'd.get("step") or 0'); [ "$s" != "?" ] && [ "$s" -ge "$1" ]; }
learner_step() { status_field 'd.get("step") or 0'; }
restarts() { docker inspect -f '{{.Name}} {{.RestartCount}}' $("${DC[@]}" ps -a -q) | sort; }
worker_names() { api GET /v1/status | json '" ".join(sorted(r["role"] + "/" + r["name"] for r in d["roles"]))'; }
check_each_step_once() {  # metrics.jsonl and trained.jsonl: steps 1..N each once (N >= $1); no trajectory trained twice
  docker exec "$(container_of control-cpu)" sh -c \
    "cat /data/runs/$RUN_NAME/metrics.jsonl; echo ===; cat /data/runs/$RUN_NAME/trained.jsonl" >"$WORK/lineage.txt" \
    || die "could not read the run's metrics.jsonl and trained.jsonl"
  python3 - "$1" "$WORK/lineage.txt" <<'EOF' || die "the run's records do not hold each step once (above)"
import json, sys
metrics, trained = open(sys.argv[2]).read().split("===\n")
def rows(text):  # only the last line may be partial (being written as we read)
    lines = [line for line in text.splitlines() if line.strip()]
    out = []
    for i, line in enumerate(lines):
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            if i != len(lines) - 1:
                raise
    return out
for name, text in (("metrics.jsonl", metrics), ("trained.jsonl", trained)):
    steps = [r["step"] for r in rows(text)]
    if steps != list(range(1, len(steps) + 1)) or len(steps) < int(sys.argv[1]) - 1:
        sys.exit(f"{name}: steps {steps}")
ids = [i for r in rows(trained) for i in r["ids"]]
if len(ids) != len(set(ids)):
    sys.exit(f"trained.jsonl: {len(ids) - len(set(ids))} trajectories trained twice")
print(f"lineage: {len(rows(trained))} steps, {len(ids)} trajectories, each once", file=sys.stderr)
EOF
}

# ---- build ---------------------------------------------------------------------------------------------
phase build
doc_replaced "docker compose --profile cpu build" "docker build of the same Dockerfile and tag ($IMAGE), with this host's local base image and wheel folder where Docker Hub and the package index are out of reach"
BUILD_ARGS=()
WHEELS=${STARE_E2E_WHEELS:-$(pip config get global.find-links 2>/dev/null || true)}
if [ -n "$WHEELS" ] && [ -d "$WHEELS" ]; then
  # a fixed port: build arguments are part of Docker's layer cache key (a new port, a new pip install)
  port=${STARE_E2E_WHEELS_PORT:-18765}
  python3 -m http.server --bind 127.0.0.1 "$port" --directory "$WHEELS" >/dev/null 2>&1 &
  WHEEL_PID=$!
  sleep 1; kill -0 "$WHEEL_PID" 2>/dev/null || die "could not serve $WHEELS on 127.0.0.1:$port (STARE_E2E_WHEELS_PORT)"
  BUILD_ARGS+=(--build-arg "PIP_FIND_LINKS=http://127.0.0.1:$port/" --build-arg PIP_EXTRA_INDEX_URL=)
  say "serving $WHEELS to the build at http://127.0.0.1:$port/"
fi
have_image python:3.12.12-slim-bookworm || { have_image stare-base:bookworm && BUILD_ARGS+=(--build-arg PYTHON_IMAGE=stare-base:bookworm); }
DOCKER_BUILDKIT=0 docker build --network host -q -f deploy/docker/Dockerfile.cpu -t "$IMAGE" "${BUILD_ARGS[@]}" . >"$WORK/build.log" 2>&1 \
  || { tail -n 40 "$WORK/build.log" >&2; die "docker build failed"; }
[ -n "$WHEEL_PID" ] && { kill "$WHEEL_PID" 2>/dev/null || true; WHEEL_PID=; }

# ---- secrets -------------------------------------------------------------------------------------------
phase secrets
doc_run "scripts/make_secrets.sh" >&2

# ---- preflight -------------------------------------------------------------------------------------------
phase preflight
"${DC[@]}" down -v --remove-orphans >/dev/null 2>&1 || true   # a previous run's leftovers
# another process on the control port (as a `stare train` on 8321 would be): refused whole, naming it
python3 -c 'import socket, sys, time; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(1); print("held", flush=True); time.sleep(120)' \
  "$STARE_CONTROL_PORT" >"$WORK/holder.out" &
HOLDER_PID=$!
wait_for "the stand-in holder on port $STARE_CONTROL_PORT" 20 grep -qx held "$WORK/holder.out"
if doc_run "scripts/compose_preflight.py" 2>"$WORK/preflight.err"; then die "the preflight passed while pid $HOLDER_PID held port $STARE_CONTROL_PORT"; fi
cat "$WORK/preflight.err" >&2
grep -q "is in use by pid $HOLDER_PID (" "$WORK/preflight.err" || die "the preflight did not name pid $HOLDER_PID as the holder"
[ -z "$("${DC[@]}" ps -a -q)" ] || die "containers exist after a refused preflight"
kill "$HOLDER_PID"; wait "$HOLDER_PID" 2>/dev/null || true; HOLDER_PID=
doc_run "scripts/compose_preflight.py" >&2

# ---- up --------------------------------------------------------------------------------------------------
phase up
doc_run "docker compose --profile cpu up -d" >&2   # builds nothing: the image exists (phase build)
wait_for "every container healthy" "$TIMEOUT" all_healthy
doc_run "docker compose --profile cpu ps" >&2
[ "$(doc_phase)" != "?" ] || die "the documented GET /v1/status (with the read token) did not answer"

# ---- names -----------------------------------------------------------------------------------------------
phase names
names_agree() {  # each rollout/reward container runs the worker named after it (<project>-<name>)
  local id container host worker
  for id in $("${DC[@]}" ps -q rollout-cpu reward-cpu); do
    container=$(docker inspect -f '{{.Name}}' "$id" | tr -d /)
    host=$(docker inspect -f '{{.Config.Hostname}}' "$id")
    worker=$(api GET /v1/status | json "[r['name'] for r in d['roles'] if r['host'] == '$host' and r['state'] == 'alive']" )
    [ "$worker" = "['${container#"$PROJECT"-}']" ] || { say "container $container (host $host) runs $worker"; return 1; }
  done
}
wait_for "every rollout and reward container to run the worker of its name" 60 names_agree
say "workers: $(worker_names)"

# ---- steps -----------------------------------------------------------------------------------------------
phase steps
wait_for "step 2" "$TIMEOUT" step_at_least 2
s1=$(learner_step)
wait_for "a step after $s1" 120 step_at_least $(( s1 + 1 ))
say "steps advance: $s1 -> $(learner_step)"

# ---- entropy ---------------------------------------------------------------------------------------------
phase entropy
target=$(api GET /v1/entropy | json 'd["target"]')
new=$(python3 -c "print(round(float('$target') + 0.02, 4))")
api PATCH /v1/entropy "{\"target\": $new}" >/dev/null
target_is() { [ "$(api GET /v1/entropy | json 'd["target"]')" = "$1" ] && [ "$(api GET /v1/entropy | json 'len(d["pending"])')" = 0 ]; }
wait_for "the learner to apply target $new" 120 target_is "$new"
say "entropy target $target -> $new (applied)"
curl -s -o /dev/null -w '%{http_code}' -X PATCH -H "Content-Type: application/json" --data '{"target": 0.1}' "$API/v1/entropy" \
  | grep -qx 401 || die "PATCH /v1/entropy without the token was not refused with 401"

# ---- crash -----------------------------------------------------------------------------------------------
phase crash
wait_for "the first checkpoint (step $(( CKPT + 1 )))" "$TIMEOUT" step_at_least $(( CKPT + 1 ))
learner=$(container_of learner-cpu)
before=$(docker inspect -f '{{.RestartCount}}' "$learner")
killed_at=$(learner_step)   # the status may lag the learner by a step: a checkpoint at killed_at + 1 is newest too
kill -9 "$(docker inspect -f '{{.State.Pid}}' "$learner")"
say "SIGKILL of the learner at step $killed_at"
restarted() { [ "$(docker inspect -f '{{.RestartCount}}' "$learner")" -gt "$before" ]; }
wait_for "Docker to restart the learner" 120 restarted
resumed_step() { docker logs "$learner" 2>&1 | sed -n 's/.*resumed .* at step \([0-9]*\).*/\1/p' | tail -n1; }
said_resumed() { [ -n "$(resumed_step)" ]; }
wait_for "the restarted learner to say 'resumed ... at step N'" "$TIMEOUT" said_resumed
resumed=$(resumed_step)
wait_for "every container healthy again" "$TIMEOUT" all_healthy
# the killed learner may have written step killed_at + 1: two past that is the restarted one's work
wait_for "the restarted learner's steps" "$TIMEOUT" step_at_least $(( killed_at + 2 ))
[ $(( resumed % CKPT )) -eq 0 ] && [ "$resumed" -le $(( killed_at + 1 )) ] && [ "$resumed" -ge $(( killed_at - CKPT )) ] \
  || die "resumed at step $resumed, not the newest checkpoint before step $killed_at"
check_each_step_once "$killed_at"
say "resumed at checkpoint step $resumed (killed at $killed_at); metrics.jsonl holds each step once"

# ---- kill ------------------------------------------------------------------------------------------------
phase kill
learner=$(container_of learner-cpu)
before=$(docker inspect -f '{{.RestartCount}}' "$learner")
resumes=$(docker logs "$learner" 2>&1 | grep -c "resumed .* at step" || true)
wait_for "a step after the crash phase" 120 step_at_least $(( $(learner_step) + 1 ))
killed_at=$(learner_step)
doc_run "docker compose --profile cpu kill learner-cpu" >&2
t_kill=$(date +%s)
phase_is() { [ "$(doc_phase)" = "$1" ]; }
wait_for "/v1/status to say phase down" 30 phase_is down
say "phase down $(( $(date +%s) - t_kill )) s after the kill (step $killed_at): $(api GET /v1/status | json 'd["reason"]')"
[ "$(docker inspect -f '{{.State.Status}}' "$learner")" = exited ] || die "the killed learner is $(docker inspect -f '{{.State.Status}}' "$learner")"
[ "$(docker inspect -f '{{.RestartCount}}' "$learner")" = "$before" ] || die "Docker restarted the learner after docker kill"
[ "$(api GET /v1/status | json '[r["state"] for r in d["roles"] if r["role"] == "learner"]')" = "['down']" ] \
  || die "the killed learner's role is not listed down"
doc_run "docker compose --profile cpu up -d" >&2
said_resumed_again() { [ "$(docker logs "$learner" 2>&1 | grep -c "resumed .* at step" || true)" -gt "$resumes" ]; }
wait_for "the learner started again to say 'resumed ... at step N'" "$TIMEOUT" said_resumed_again
wait_for "the phase to say training again" 120 phase_is training
wait_for "its steps" "$TIMEOUT" step_at_least $(( killed_at + 2 ))
check_each_step_once "$killed_at"
say "up -d: the learner resumed at step $(resumed_step) (killed at step $killed_at); each step once"

# ---- redeploy --------------------------------------------------------------------------------------------
phase redeploy
names_before=$(worker_names)
down_at=$(learner_step)
[ $(( down_at + 2 )) -le "$STEPS" ] || die "the run reached step $down_at of $STEPS before the redeploy: nothing left to resume (raise STARE_E2E_STEPS)"
"${DC[@]}" --profile cpu down >&2
"${DC[@]}" --profile cpu up -d --no-build >&2
learner=$(container_of learner-cpu)
wait_for "the new learner to say 'resumed ... at step N'" "$TIMEOUT" said_resumed
wait_for "every container healthy" "$TIMEOUT" all_healthy
wait_for "the new learner's steps" "$TIMEOUT" step_at_least $(( down_at + 2 ))
say "the new learner resumed at step $(resumed_step) (down at step $down_at)"
[ "$(api GET /v1/entropy | json 'd["target"]')" = "$new" ] || die "the changed target $new did not survive down/up"
check_each_step_once "$down_at"
names_after=$(worker_names)
[ "$names_after" = "$names_before" ] || die "worker names changed across down/up: '$names_before' -> '$names_after'"
say "resumed after step $down_at with target $new; workers: $names_after"

# ---- monitoring ------------------------------------------------------------------------------------------
phase monitoring
"${DC[@]}" --profile cpu --profile monitoring up -d --no-build prometheus >&2
target_up() {
  curl -fsS --max-time 5 "http://127.0.0.1:$STARE_PROMETHEUS_PORT/api/v1/targets" \
    | json '[t["health"] for t in d["data"]["activeTargets"] if t["labels"]["job"] == "stare-control"] == ["up"]' | grep -qx True
}
wait_for "Prometheus to scrape stare-control (target up)" 120 target_up
scraped() {
  curl -fsS --max-time 5 "http://127.0.0.1:$STARE_PROMETHEUS_PORT/api/v1/query?query=stare_step" \
    | json 'len(d["data"]["result"]) > 0' | grep -qx True
}
wait_for "stare_step in Prometheus" 60 scraped
say "Prometheus: stare-control up, stare_step scraped"

# ---- finish ----------------------------------------------------------------------------------------------
phase finish
finished() { [ "$(status_field 'd["phase"]')" = finished ]; }
wait_for "the run to finish (step $STEPS)" "$TIMEOUT" finished
[ "$(learner_step)" = "$STEPS" ] || die "finished at step $(learner_step), not $STEPS"
check_each_step_once "$STEPS"
learner=$(container_of learner-cpu)
exited() { [ "$(docker inspect -f '{{.State.Status}}' "$learner")" = exited ]; }
wait_for "the learner to exit" 120 exited
code=$(docker inspect -f '{{.State.ExitCode}}' "$learner")
[ "$code" = 0 ] || die "the finished learner exited with $code"
snapshot=$(restarts)
sleep "${STARE_E2E_SETTLE_S:-45}"
[ "$(restarts)" = "$snapshot" ] || die "containers restarted after the run finished: $(restarts)"
[ "$(docker inspect -f '{{.State.Status}}' "$learner")" = exited ] || die "the finished learner was started again"
[ "$(status_field 'd["phase"]')" = finished ] || die "status no longer says finished"
for s in rollout-cpu reward-cpu control-cpu redis; do
  for id in $("${DC[@]}" ps -q "$s"); do
    [ "$(docker inspect -f '{{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{else}}healthy{{end}}' "$id")" = "running healthy" ] \
      || die "$s is not running and healthy after the run finished"
  done
done
say "finished at step $STEPS; the learner exited 0 and stayed down; workers idle and healthy; no restarts"

# ---- down ------------------------------------------------------------------------------------------------
phase down
"${DC[@]}" --profile cpu --profile monitoring down -v >&2
[ -z "$(docker volume ls -q --filter "label=com.docker.compose.project=$PROJECT")" ] || die "volumes left after down -v"
doc_all_done
phase end

echo "compose e2e passed in $(( $(date +%s) - T0 )) s"
printf '| phase | s |\n| --- | ---: |\n'
for t in "${TIMINGS[@]}"; do printf '| %s | %s |\n' ${t}; done
exit 0
}
