"""The type check of the tree (tests/unit/test_types.py, the pre-commit hook): what mypy checks, and the
early start tests/conftest.py gives it so that it runs beside the suite's first tests."""

import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("meshrl", "services", "orchestrator", "cli", "bench", "scripts", "testkit")
MYPY = [sys.executable, "-m", "mypy", *PACKAGES]


class Early:
    """mypy started when the session has collected its tests, at a low priority (nice 10), so that a cold
    first check (about a minute) runs in the time the suite's first tests leave the cores idle (waiting on
    services to start) instead of after them (tests/conftest.py starts it)."""

    def __init__(self) -> None:
        self.out = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(["nice", "-n", "10", *MYPY], cwd=ROOT, stdout=self.out, stderr=subprocess.STDOUT)

    def result(self) -> tuple[int, str]:
        code = self.proc.wait()
        self.out.seek(0)
        return code, self.out.read()
