#!/usr/bin/env bash
# The GPU lane: tests marked `gpu` (tests/gpu), with the machine's GPUs visible. Run it where torch has
# CUDA, e.g. `PYTHON=python3 bash scripts/test_gpu.sh` on a GPU host whose python has torch, transformers,
# grpcio and protobuf (`pip install -e . --no-deps` there for the rest); by default it uses .venv.
# The default suite (scripts/test.sh) hides GPUs and runs on CPU, as CI does.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
MESHRL_TEST_GPU=1 exec "$PYTHON" -m pytest -m gpu -p no:cacheprovider "${@:-tests/gpu}"
