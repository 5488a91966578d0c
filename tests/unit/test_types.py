"""The whole tree type-checks clean under mypy, with the settings in pyproject.toml ([tool.mypy]): CI runs
this with the suite, so nothing lands that the checker rejects. The pre-commit hook runs this file as a
script: the same check, without pytest.

PACKAGES is the one list of what is checked, here and in the hook: the shared package, the services, the
orchestrator and the CLI, and the scripts users run by hand (bench/, scripts/), which would otherwise
rot unnoticed when an API they call changes. Only tests/ is left out (pytest runs it). mypy keeps its
cache in .mypy_cache at the checkout's root: a first run reads torch, transformers and vLLM (about a
minute on 2 cores), later ones take seconds.
"""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("meshrl", "services", "orchestrator", "cli", "bench", "scripts")
MYPY = [sys.executable, "-m", "mypy", *PACKAGES]


def test_mypy_finds_nothing():
    out = subprocess.run(MYPY, cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]


if __name__ == "__main__":  # the pre-commit hook
    sys.exit(subprocess.call(MYPY, cwd=ROOT))
