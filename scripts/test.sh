#!/usr/bin/env bash
# The test command: set up .venv (pinned) and run the whole suite on CPU.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh tests/unit -k codec`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest "${@:-tests}"
