#!/usr/bin/env bash
# The test command: set up .venv (pinned) and run the whole suite on CPU, on two pytest-xdist workers
# (MESHRL_TEST_WORKERS; 0: one process), each on its own share of the cores (tests/conftest.py pin_worker;
# MESHRL_TEST_PIN=0: not). A test file runs whole on one worker, the longest first
# (tests/conftest.py orders them), so module fixtures (a vLLM engine, a service with several ranks) start once.
# The whole suite starts with ruff's format and lint checks (seconds), then the unit tests with the type
# check (minutes), then the rest. Extra arguments go to pytest, in one process, without them, e.g.
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
# then the unit tests, the type check among them (a few minutes), then the rest; a unit failure is
# reported at once and the rest still runs, so one run shows every failure
xdist=(-n "${MESHRL_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder)
unit=0
.venv/bin/python -m pytest "${xdist[@]}" tests/unit || unit=$?
[ "$unit" -eq 0 ] || echo "scripts/test.sh: the unit tests failed (exit $unit); running the rest" >&2
rest=0
.venv/bin/python -m pytest "${xdist[@]}" tests/contract tests/e2e tests/gpu || rest=$?
if [ "$unit" -ne 0 ]; then exit "$unit"; fi
exit "$rest"
