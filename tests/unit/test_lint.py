"""The tree is formatted and lint-clean by ruff's rules in pyproject.toml (generated protobuf code aside):
CI runs this with the suite, so nothing lands that the formatter or the linter would change."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
RUFF = [sys.executable, "-m", "ruff"]


def test_ruff_format_leaves_the_tree_as_it_is():
    out = subprocess.run([*RUFF, "format", "--check", "."], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]


def test_ruff_lint_finds_nothing():
    out = subprocess.run([*RUFF, "check", "--output-format", "concise", "."], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
