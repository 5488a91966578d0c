"""The sandbox behind a run's endpoint (rollout.agent_sandbox): where an episode's agent runs programs with
POST /v1/sandbox/run (meshrl/gateway/sandbox.py), in a session that lives as long as its episode's key.
"auto" starts a sandbox service for the run (`meshrl serve sandbox`, a child that dies with the run),
HOST:PORT uses one already running; one per run, for its every step, stopped at its end."""

from __future__ import annotations

import subprocess
import threading

from meshrl.gateway.sandbox import Sandboxes
from meshrl.lifeline import serve_child

_started: dict[int, tuple[Sandboxes, subprocess.Popen | None]] = {}  # per run (its mesh)
_lock = threading.Lock()


def sandbox_for(mesh) -> Sandboxes | None:
    """The run's sandbox for its endpoint, started on first use; None where rollout.agent_sandbox is ""."""
    where = mesh.cfg.rollout.agent_sandbox
    if not where:
        return None
    with _lock:
        if id(mesh) not in _started:
            proc, address = serve_child(["sandbox"]) if where == "auto" else (None, where)
            _started[id(mesh)] = (Sandboxes(address), proc)
        return _started[id(mesh)][0]


def close_sandboxes(kill: bool = False) -> None:
    """Stop the sandbox services the runs started (a run's way out; kill: SIGKILL, waiting for nothing)."""
    with _lock:
        started = list(_started.values())
        _started.clear()
    for _, proc in started:
        if proc is None:
            continue
        proc.kill() if kill else proc.terminate()
        if not kill:
            proc.wait(30)
