"""The whole tree type-checks clean under mypy, with the settings in pyproject.toml ([tool.mypy]): CI runs
this with the suite, so nothing lands that the checker rejects. The pre-commit hook runs this file as a
script: the same check, without pytest.

PACKAGES is the one list of what is checked, here and in the hook: the shared package, the services, the
orchestrator and the CLI, the scripts users run by hand (bench/, scripts/) and what they share with the
tests (testkit/), which would otherwise rot unnoticed when an API they call changes. Only tests/ is left
out (pytest runs it). mypy keeps its
cache in .mypy_cache at the checkout's root: a first run reads torch, transformers and vLLM (about a
minute on 2 cores), later ones take seconds.
"""

import subprocess
import sys

from testkit.mypy_check import MYPY, ROOT


def test_mypy_finds_nothing(request):
    early = getattr(request.config, "mypy_early", None)
    if early is not None:
        code, text = early.result()
    else:
        out = subprocess.run(MYPY, cwd=ROOT, capture_output=True, text=True)
        code, text = out.returncode, out.stdout + out.stderr
    assert code == 0, text[-5000:]


if __name__ == "__main__":  # the pre-commit hook
    sys.exit(subprocess.call(MYPY, cwd=ROOT))
