"""The interpreter agent workers run in: meshrl's own, or the one rollout.agent_python names (a venv of
the agent's framework: openai-agents, langchain, verifiers..., where meshrl is not installed).

    check_python("/opt/agents-venv/bin/python")     # ValueError in one line unless it runs Python >= 3.9
    process = Process(python, [spec, "8"])         # python .../worker.py SPEC 8 READ_FD WRITE_FD

The worker (worker.py) is one standard-library file run by path, so any interpreter runs it. A named
interpreter gets the run's environment without PYTHONPATH and PYTHONHOME: they name meshrl's Python, and
would put its packages before the venv's own (a wrapper script that execs the interpreter can set them).
"""

import os
import pathlib
import re
import subprocess
import sys

from meshrl.pipes import Child

WORKER = str(pathlib.Path(__file__).resolve().with_name("worker.py"))
MIN_VERSION = (3, 9)
CHECK_TIMEOUT = 60.0  # seconds the interpreter may take to print its version
# runs on any Python, 2 included, so that an old one is named as such rather than failing to parse
PROBE = "import sys; sys.stdout.write('%d.%d.%d' % tuple(sys.version_info[:3]))"
MESHRL_PYTHON_VARS = ("PYTHONPATH", "PYTHONHOME")


def check_python(python: str) -> None:
    """`python` runs and is Python >= 3.9 (the worker's oldest): ValueError naming rollout.agent_python."""
    try:
        probe = subprocess.run(
            [python, "-c", PROBE], capture_output=True, text=True, env=env_for(python), timeout=CHECK_TIMEOUT
        )
    except subprocess.TimeoutExpired:
        raise ValueError(f"rollout.agent_python={python} did not answer within {CHECK_TIMEOUT:g} s") from None
    except OSError as e:
        raise ValueError(f"rollout.agent_python={python} cannot run: {e.strerror or e}") from None
    version = probe.stdout.strip()
    if probe.returncode or not re.fullmatch(r"\d+\.\d+\.\d+", version):
        said = (probe.stderr.strip().splitlines() or [version or f"exit code {probe.returncode}"])[-1][:200]
        raise ValueError(f"rollout.agent_python={python} is not a Python interpreter: {said}")
    if tuple(int(part) for part in version.split(".")[:2]) < MIN_VERSION:
        raise ValueError(
            f"rollout.agent_python={python} is Python {version}: agent workers need Python >= "
            f"{'.'.join(map(str, MIN_VERSION))}"
        )


def env_for(python: str) -> dict[str, str]:
    """The environment of a worker run by `python` ("" or meshrl's own: the run's as it is)."""
    if not python or python == sys.executable:
        return dict(os.environ)
    return {k: v for k, v in os.environ.items() if k not in MESHRL_PYTHON_VARS}


class Process(Child):
    """`PYTHON worker.py ARGS... READ_FD WRITE_FD` in a session of its own (a kill takes whatever the
    agent started too): requests go to task_w, replies come from res_r (meshrl/pipes.py's Child)."""

    def __init__(self, python: str, args: list[str]):
        try:
            super().__init__("", args, env=env_for(python), command=[python or sys.executable, WORKER])
        except OSError as e:
            raise ValueError(f"rollout.agent_python={python} cannot run: {e.strerror or e}") from None
