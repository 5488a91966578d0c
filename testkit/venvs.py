"""A pinned venv of its own for a hub or an agent framework (scripts/hub_venv.sh), as the tests that train
through one build it: tests/e2e/test_hubs.py and tests/e2e/test_frameworks.py."""

import pathlib
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[1]


def pinned_python(name: str, *packages: str) -> str:
    """The venv of constraints/hub-NAME.txt (built, or found up to date) with `packages` (folders or
    names) installed too: its python."""
    made = subprocess.run(
        ["bash", str(ROOT / "scripts/hub_venv.sh"), name, *packages],
        capture_output=True,
        text=True,
        timeout=800,
    )
    assert made.returncode == 0, made.stderr[-3000:]
    return made.stdout.strip().splitlines()[-1]
