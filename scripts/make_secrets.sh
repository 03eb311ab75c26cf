#!/usr/bin/env sh
# Create every secret the compose file mounts and the Kubernetes base reads (the one documented way;
# docker-compose.yml's header, README and docs/deploy.md point here):
#
#   scripts/make_secrets.sh            # deploy/secrets/{api-token,api-read-token,redis-password}
#   scripts/make_secrets.sh DIR        # the same files under DIR (e.g. deploy/k8s/base/secrets)
#
# Each secret is 32 random bytes as hex, mode 0444 (the containers run as other users than the
# file's owner; the folder is git-ignored). An existing file is kept: rotating a secret is
# `rm` + this script + `docker compose up -d --force-recreate`. Needs only /dev/urandom and od.
set -eu

DIR=${1:-"$(cd "$(dirname "$0")/.." && pwd)/deploy/secrets"}
SECRETS="api-token api-read-token redis-password"   # docker-compose.yml `secrets:` (tests/deploy checks it)

mkdir -p "$DIR"
umask 077
for name in $SECRETS; do
  path="$DIR/$name"
  if [ -s "$path" ]; then
    echo "kept     $path"
    continue
  fi
  tmp="$path.tmp.$$"
  od -An -N32 -tx1 /dev/urandom | tr -d ' \n' >"$tmp"
  [ "$(wc -c <"$tmp")" -eq 64 ] || { rm -f "$tmp"; echo "make_secrets: could not read 32 random bytes" >&2; exit 1; }
  chmod 0444 "$tmp"
  mv "$tmp" "$path"
  echo "created  $path"
done
