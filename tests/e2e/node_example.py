"""Starting one of the Node.js examples (examples/node-*) for a test: npm ci, then its server on a free port."""

import pathlib
import shutil
import subprocess

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
needs_node = pytest.mark.skipif(not (shutil.which("node") and shutil.which("npm")), reason="needs node and npm")


def start(name: str) -> tuple[subprocess.Popen, str]:
    """(the server's process, its address) for examples/<name>."""
    folder = EXAMPLES / name
    subprocess.run(
        ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=folder,
        check=True,
        capture_output=True,
        timeout=300,
    )
    proc = subprocess.Popen(["node", "server.js", "--port", "0"], cwd=folder, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("listening on 127.0.0.1:"), line
    return proc, line.split()[-1]
