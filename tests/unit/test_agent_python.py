"""rollout.agent_python: agent workers in another interpreter, one where meshrl is not installed (an agent
framework's own venv), each worker playing many episodes against a real endpoint; the interpreter is
checked in one line. The other interpreter here is this one with -I -S (no site-packages: neither meshrl
nor its dependencies), so no venv has to be built."""

import ast
import concurrent.futures
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from orchestrator.agents import worker
from orchestrator.agents.interpreter import check_python
from orchestrator.agents.pool import AgentPool, check_agent_python
from orchestrator.config import RolloutSection, load_config
from testkit.agent_endpoint import endpoint, write_agent

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROMPT = [{"role": "user", "content": "2+2="}]


def script(path: pathlib.Path, body: str) -> str:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def bare_python(tmp_path) -> str:
    """An interpreter without meshrl: this one, isolated and without site-packages."""
    python = script(tmp_path / "python", f'exec {sys.executable} -I -S "$@"')
    found = subprocess.run([python, "-c", "import meshrl"], cwd=ROOT, capture_output=True, text=True)
    assert found.returncode != 0 and "No module named 'meshrl'" in found.stderr  # not even from the checkout
    return python


@pytest.mark.parametrize("path", [worker.__file__, ROOT / "meshrl" / "worker_main.py"])
def test_the_worker_is_standard_library_files_python_3_9_reads(path):
    """The worker and the kit it loads by path (meshrl/worker_main.py)."""
    source = pathlib.Path(path).read_text()
    tree = ast.parse(source, feature_version=(3, 9))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported - set(sys.stdlib_module_names)
    assert "from __future__ import annotations" in source  # `bytes | None` annotations stay unevaluated on 3.9


def play(gateway, pool: AgentPool, task: dict) -> tuple:
    session = gateway.open()
    try:
        result, error = pool.play(task, gateway.base_url, session.key)
    finally:
        recorded = gateway.close(session.key)
    return result, error, recorded


def test_workers_in_a_python_without_meshrl_play_many_episodes_each(bare_python, tmp_path, monkeypatch):
    """Two workers play twelve episodes through the endpoint (each recorded); the one that raises is lost
    alone; one that ends its process loses its worker, and a fresh one takes the slot."""
    monkeypatch.chdir(tmp_path)  # the worker's imports start in the run's folder, as under `python -m`
    gateway = endpoint(tmp_path / "model")
    pool = AgentPool(f"{write_agent(tmp_path)}:agent", workers=2, threads=4, timeout=60, python=bare_python)
    try:
        tasks = [{"prompt": PROMPT, "fail": "raise" if i == 5 else ""} for i in range(12)]
        with concurrent.futures.ThreadPoolExecutor(8) as threads:
            played = list(threads.map(lambda t: play(gateway, pool, t), tasks))
        lost = played.pop(5)
        assert lost[0] is None and "raised RuntimeError: this episode's tool is down" in lost[1]
        assert all(error == "" for _, error, _ in played), played
        assert all(r["reward"] == 1.0 and r["client"] == "urllib" and not r["meshrl"] for r, _, _ in played)
        assert all(recorded.last is not None and recorded.calls == 1 for _, _, recorded in played)
        pids = {r["pid"] for r, _, _ in played}
        assert pids == {w.child.proc.pid for w in pool.slots if w} and len(pids) == 2  # 11 episodes, 2 processes

        result, error, _ = play(gateway, pool, {"prompt": PROMPT, "fail": "exit"})
        assert result is None and "died (exit code 3)" in error
        again = [play(gateway, pool, {"prompt": PROMPT}) for _ in range(4)]
        assert all(r is not None and r["reward"] == 1.0 for r, _, _ in again)
        now = {w.child.proc.pid for w in pool.slots if w}
        assert len(now - pids) == 1 and {r["pid"] for r, _, _ in again} <= now  # the dead one's slot restarted
    finally:
        pool.close()
        gateway.stop()


def test_a_named_python_is_checked_in_one_line(bare_python, tmp_path):
    with pytest.raises(ValueError, match=r"agent_python=/no/such/python cannot run: No such file"):
        check_python("/no/such/python")
    with pytest.raises(ValueError, match=r"is Python 3\.8\.10: agent workers need Python >= 3\.9"):
        check_python(script(tmp_path / "old", "printf 3.8.10"))
    with pytest.raises(ValueError, match=r"is not a Python interpreter: exit code 1"):
        check_python("/bin/false")
    check_python(bare_python)

    needs_numpy = tmp_path / "needs_numpy.py"
    needs_numpy.write_text("import numpy\n\ndef agent(task, base_url, api_key):\n    return 1.0\n")
    section = RolloutSection(agent=f"{needs_numpy}:agent", agent_python=bare_python)
    with pytest.raises(ValueError, match=r"could not import .*needs_numpy.py with Python 3.*No module named 'numpy'"):
        check_agent_python(section)  # preflight's: it imports there, not where meshrl runs
    check_agent_python(RolloutSection(agent=f"{write_agent(tmp_path)}:agent", agent_python=bare_python))

    pool = AgentPool(f"{needs_numpy}:agent", workers=1, threads=1, timeout=5, python="/no/such/python")
    with pytest.raises(ValueError, match="cannot run"):  # the pool checks before its first worker too
        pool.play({}, "u", "k")
    pool.close()


def test_agent_python_is_read_with_an_agent():
    with pytest.raises(ValueError, match=r"rollout.agent_python=/x is read with rollout.agent"):
        load_config(None, ["rollout.agent_python=/x"])


RUN = """
import os, signal, sys, threading, time
from orchestrator.agents.pool import AgentPool
pool = AgentPool(sys.argv[1], workers=1, threads=2, timeout=600)
threading.Thread(target=pool.play, args=({"prompt": [], "fail": "hang"}, "u", "k"), daemon=True).start()
while not (pool.slots[0] and pool.slots[0].load):
    time.sleep(0.05)
print(pool.slots[0].child.proc.pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_run_killed_with_an_episode_in_flight_leaves_no_worker(tmp_path):
    """The worker's lifeline is its request pipe: the kernel closes the run's end when it dies (kill -9)."""
    agent = tmp_path / "hangs.py"
    agent.write_text("import time\n\ndef agent(task, base_url, api_key):\n    time.sleep(600)\n")
    with open(tmp_path / "stderr", "w") as err:  # a file: a worker left behind would hold a pipe open
        run = subprocess.run(
            [sys.executable, "-c", RUN, f"{agent}:agent"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            timeout=120,
        )
    assert run.returncode == -9, (tmp_path / "stderr").read_text()
    pid = int(run.stdout)
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if alive(pid):
        os.kill(pid, signal.SIGKILL)
        raise AssertionError(f"the agent worker {pid} outlived the run")


def alive(pid: int) -> bool:
    try:
        return "zombie" not in pathlib.Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
