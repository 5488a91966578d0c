#!/usr/bin/env bash
# Builds a Debian bookworm base image from Debian's own packages, for machines whose Docker engine
# cannot pull from Docker Hub (where the Dockerfile's default base, python:3.11-slim, lives):
# debootstrap a minimal bookworm, then `docker import` it. Debian bookworm's python3 is 3.11.
#   bash scripts/docker_base.sh                 # -> meshrl-base:bookworm
#   TAG=... MIRROR=... bash scripts/docker_base.sh
# Needs root, debootstrap (`apt-get install debootstrap`) and a reachable Debian mirror.
# The packages are those the Dockerfile installs on python:3.11-slim (build-essential: torch's
# inductor compiles C++ at run time; libnuma1 for vLLM's CPU build) plus Python itself.
set -euo pipefail
tag="${TAG:-meshrl-base:bookworm}"
mirror="${MIRROR:-http://deb.debian.org/debian}"
packages=python3,python3-venv,python3-dev,build-essential,libnuma1,ca-certificates
root="$(mktemp -d /tmp/meshrl-base.XXXXXX)"
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase --include="$packages" bookworm "$root" "$mirror"
# what an image does not need: apt's downloaded packages and lists, docs, man pages
chroot "$root" apt-get clean
rm -rf "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/*
# python:3.11-slim's environment, as far as the Dockerfile relies on it
tar -C "$root" --numeric-owner -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["bash"]' \
    --message "debootstrap --variant=minbase bookworm ($packages)" - "$tag"
docker run --rm "$tag" python3.11 -c 'import sys, venv, ensurepip; print("base:", sys.version.split()[0])'
