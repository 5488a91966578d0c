"""docs/configuration.md is what the config classes say today (scripts/config_docs.py writes it)."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_configuration_page_is_current():
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts/config_docs.py"), "--check"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
