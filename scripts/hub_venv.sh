#!/usr/bin/env bash
# Creates .venv-hubs/HUB, an environment hub's own venv (a run's rollout.agent_python), with the hub's
# package pinned by constraints/hub-HUB.txt and the environment packages given after it installed too:
#     bash scripts/hub_venv.sh verifiers examples/hubs/verifiers/environments/vf_sums
# meshrl itself is not installed there (the hub's dependencies need not agree with meshrl's). Idempotent:
# it reinstalls only when the constraints or the packages asked for change. Prints the venv's python.
set -euo pipefail
cd "$(dirname "$0")/.."
hub="${1:?usage: scripts/hub_venv.sh HUB [PACKAGE_OR_FOLDER...]}"
shift
pins="constraints/hub-$hub.txt"
[ -f "$pins" ] || { echo "hub_venv: no $pins: the hubs are $(ls constraints | sed -n 's/^hub-\(.*\)\.txt$/\1/p' | xargs)" >&2; exit 2; }
bash scripts/setup.sh >&2  # meshrl's venv, which carries uv
venv=".venv-hubs/$hub"
# what is installed: the pins, the packages named, and what the folders among them hold
folders() { for p in "$@"; do if [ -d "$p" ]; then find "$p" -type f -print0 | sort -z | xargs -0 cat; fi; done; }
want="$(cat "$pins" | sha256sum | cut -c1-16) $* $(folders "$@" | sha256sum | cut -c1-16)"
if [ ! -f "$venv/.meshrl-installed" ] || [ "$(cat "$venv/.meshrl-installed")" != "$want" ]; then
    base="$(.venv/bin/python -c 'import sys; print(sys._base_executable)')"
    [ -x "$venv/bin/python" ] || .venv/bin/uv venv -q --python "$base" "$venv" >&2
    # a package in a folder is built from a copy of it: a build writes build/ and *.egg-info beside its
    # sources, and none of that belongs in the checkout
    copies="$(mktemp -d)"
    trap 'rm -rf "$copies"' EXIT
    packages=()
    for p in "$@"; do
        if [ -d "$p" ]; then
            cp -r "$p" "$copies/$(basename "$p")" && packages+=("$copies/$(basename "$p")")
        else
            packages+=("$p")
        fi
    done
    VIRTUAL_ENV="$venv" .venv/bin/uv pip install -q --compile-bytecode -c "$pins" "$hub" ${packages[@]+"${packages[@]}"} >&2
    echo "$want" > "$venv/.meshrl-installed"
fi
echo "$PWD/$venv/bin/python"
