#!/usr/bin/env bash
# Make a Docker engine available for the docker tests: install Debian's engine and
# debootstrap (skipped when present), start dockerd in the background when none answers,
# and wait until it does. Idempotent; a second run takes about a second.
#   DDPDEPLOY_DOCKERD_LOG  where dockerd logs (default /var/log/ddpdeploy/dockerd.log,
#                          outside the clone so test runs never see it as a change)
set -euo pipefail

log_file="${DDPDEPLOY_DOCKERD_LOG:-/var/log/ddpdeploy/dockerd.log}"
sudo=""
if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi

# Debian's engine brings its own (older) CLI at /usr/bin/docker; /usr/local/bin/docker may be
# a newer client without buildx. The tests talk to the engine API through the SDK instead.
engine_ping() { timeout 5 /usr/bin/docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

missing=()
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
if [ "${#missing[@]}" -gt 0 ]; then
    echo "docker-setup: installing ${missing[*]}" >&2
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
fi

if [ -z "${DOCKER_HOST:-}" ] && ! engine_ping; then
    echo "docker-setup: starting dockerd (log: $log_file)" >&2
    $sudo mkdir -p "$(dirname "$log_file")"
    # setsid: dockerd outlives this script and the CI step's process group.
    $sudo setsid nohup dockerd >"$log_file" 2>&1 < /dev/null &
fi

for _ in $(seq 1 60); do
    if engine_ping; then
        echo "docker-setup: engine $(/usr/bin/docker version --format '{{.Server.Version}}')" >&2
        exit 0
    fi
    sleep 1
done
echo "docker-setup: the engine did not answer within 60s; see $log_file" >&2
tail -n 20 "$log_file" >&2 || true
exit 1
