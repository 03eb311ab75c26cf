#!/usr/bin/env bash
# Environment-only setup of a Docker host that cannot reach Docker Hub (this project's CI/agent
# machines: Debian bookworm, root, no systemd). Not part of stare: on a machine with Docker and
# Compose v2 and access to Docker Hub, skip this file and run scripts/compose_e2e.sh directly.
#
#   scripts/docker_host_setup.sh             # as root; idempotent: each step is skipped when already done
#
# What it does, each only when missing:
#   1. apt-get install docker.io (Engine 20.10) and mmdebstrap; start dockerd by hand (overlay2)
#   2. Compose v2: `apt-get download` of the next Debian release's docker-compose package (v2.26;
#      bookworm has only v1), unpacked into $DOCKER_CONFIG/cli-plugins (a separate apt state under
#      /var/cache/stare-docker-setup: the system's sources are not touched)
#   3. the base images Docker Hub would give, built locally from Debian packages and tagged with
#      local names that scripts/compose_e2e.sh passes through the compose file's image variables:
#        stare-base:bookworm     mmdebstrap minbase + python3 (+venv, pip, `python`), g++, and this
#                                host's CA bundle (its TLS interception needs it for pip and apt)
#        stare-redis:bookworm    Debian's redis-server 7.0 with an entrypoint like the official
#                                image's (docker-entrypoint.sh: chown /data, drop to user redis)
#        stare-prometheus:bookworm  Debian's prometheus (2.42) + wget for the healthcheck
# Everything comes from the Debian and PyPI registries; nothing else is contacted.
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "docker_host_setup: run it as root (it installs packages, starts dockerd and builds images)" >&2; exit 2; }

STATE=/var/cache/stare-docker-setup
DOCKER_CONFIG=${DOCKER_CONFIG:-$HOME/.docker}
export DOCKER_CONFIG
mkdir -p "$STATE" "$DOCKER_CONFIG/cli-plugins"
log() { printf '[docker-host-setup] %s\n' "$*" >&2; }

# ---- 1. Engine -----------------------------------------------------------------------------------
if ! command -v dockerd >/dev/null 2>&1 || ! command -v mmdebstrap >/dev/null 2>&1; then
  log "apt-get install docker.io mmdebstrap"
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
    docker.io mmdebstrap iptables >/dev/null
fi
if ! timeout 10 docker info >/dev/null 2>&1; then
  log "starting dockerd (log: /var/log/stare-dockerd.log)"
  nohup dockerd --storage-driver overlay2 >/var/log/stare-dockerd.log 2>&1 &
  for _ in $(seq 1 60); do timeout 5 docker info >/dev/null 2>&1 && break; sleep 1; done
  timeout 10 docker info >/dev/null || { tail -n 30 /var/log/stare-dockerd.log >&2; exit 1; }
fi

# ---- 2. Compose v2 plugin --------------------------------------------------------------------------
if ! timeout 10 docker compose version >/dev/null 2>&1; then
  log "fetching Debian trixie's docker-compose (Compose v2) as a CLI plugin"
  mkdir -p "$STATE/lists/partial" "$STATE/deb"
  echo "deb http://deb.debian.org/debian trixie main" >"$STATE/trixie.list"
  APT_OPTS=(-o "Dir::Etc::SourceList=$STATE/trixie.list" -o "Dir::Etc::SourceParts=-"
            -o "Dir::State::Lists=$STATE/lists" -o "Dir::Cache::archives=$STATE/deb")
  apt-get "${APT_OPTS[@]}" update >/dev/null
  (cd "$STATE/deb" && apt-get "${APT_OPTS[@]}" download docker-compose >/dev/null)
  rm -rf "$STATE/x" && dpkg-deb -x "$STATE"/deb/docker-compose_*.deb "$STATE/x"
  install -m 0755 "$STATE/x/usr/libexec/docker/cli-plugins/docker-compose" "$DOCKER_CONFIG/cli-plugins/"
  docker compose version >&2
fi

# ---- 3. Local base images --------------------------------------------------------------------------
if ! docker image inspect stare-base:bookworm >/dev/null 2>&1; then
  log "mmdebstrap bookworm -> stare-base:bookworm (a few minutes)"
  mmdebstrap --variant=minbase \
    --include=python3,python3-venv,python3-pip,python-is-python3,ca-certificates,g++,make,libc6-dev \
    --customize-hook='copy-in /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
    bookworm "$STATE/rootfs.tar" >/dev/null
  docker import --change 'CMD ["python3"]' "$STATE/rootfs.tar" stare-base:bookworm >/dev/null
  rm -f "$STATE/rootfs.tar"
fi

if ! docker image inspect stare-redis:bookworm >/dev/null 2>&1; then
  log "building stare-redis:bookworm"
  docker build --network host -t stare-redis:bookworm - >/dev/null <<'EOF'
FROM stare-base:bookworm
RUN apt-get update && apt-get install -y --no-install-recommends redis-server \
 && rm -rf /var/lib/apt/lists/* && mkdir -p /data && chown redis:redis /data \
 && printf '#!/bin/sh\nset -e\nif [ "$(id -u)" = 0 ]; then find . \\! -user redis -exec chown redis "{}" +; exec setpriv --reuid=redis --regid=redis --init-groups "$@"; fi\nexec "$@"\n' \
    > /usr/local/bin/docker-entrypoint.sh && chmod 0755 /usr/local/bin/docker-entrypoint.sh
WORKDIR /data
ENTRYPOINT ["docker-entrypoint.sh"]
CMD ["redis-server"]
EOF
fi

if ! docker image inspect stare-prometheus:bookworm >/dev/null 2>&1; then
  log "building stare-prometheus:bookworm"
  docker build --network host -t stare-prometheus:bookworm - >/dev/null <<'EOF'
FROM stare-base:bookworm
RUN apt-get update && apt-get install -y --no-install-recommends prometheus wget \
 && rm -rf /var/lib/apt/lists/* && mkdir -p /prometheus && chown nobody:nogroup /prometheus
USER nobody
WORKDIR /prometheus
ENTRYPOINT ["/usr/bin/prometheus"]
EOF
fi
log "ready: $(docker version --format 'engine {{.Server.Version}}'), $(docker compose version --short 2>/dev/null | sed 's/^/compose /')"
