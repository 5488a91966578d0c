#!/usr/bin/env bash
# The test command: set up .venv (pinned) and run the whole suite on CPU, on two pytest-xdist workers
# (MESHRL_TEST_WORKERS; 0: one process), each on its own share of the cores (tests/conftest.py pin_worker;
# MESHRL_TEST_PIN=0: not). A test file runs whole on one worker, the longest first
# (tests/conftest.py orders them), so module fixtures (a vLLM engine, a service with several ranks) start once.
# The whole suite starts with ruff's format and lint checks (seconds), then runs every test in one session. Extra arguments go to pytest, in one process, without them, e.g.
# `bash scripts/test.sh tests/unit -k codec`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ $# -gt 0 ]; then
    exec .venv/bin/python -m pytest "$@"
fi
# lint and format first: a failure shows in seconds, not after the suite (the unit tests check them too)
.venv/bin/ruff format --check --quiet . || { echo "ruff format: the files above need .venv/bin/ruff format" >&2; exit 1; }
.venv/bin/ruff check --quiet .
# then every test in one pytest session: the longest files first (tests/conftest.py: the type check among
# them, in a process of its own beside the others), the unit tests last, filling the workers' tail; one
# session rather than two saves a second start and the first session's tail (bench/RESULTS.md "The suite's time")
xdist=(-n "${MESHRL_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder)
exec .venv/bin/python -m pytest "${xdist[@]}" tests/unit tests/contract tests/e2e tests/gpu
