"""Processes that die with the process that started them: no service outlives a killed orchestrator,
no actor rank outlives its rank 0.

The parent puts its pid in MESHRL_PARENT_PID (child_env); the child calls die_with_parent() first
thing. On Linux the kernel then sends the child SIGTERM when the parent dies, kill -9 included (the
services stop cleanly on SIGTERM); a parent already gone is noticed at once. Elsewhere nothing is done.
serve_child starts a service as such a child of a service (the reward service's own sandbox service).
running(pid) says whether a process still lives, for the sweeps of what dead processes left (shared
memory segments, sandbox cgroups).
"""

import ctypes
import os
import pathlib
import signal
import subprocess
import sys
import threading

VAR = "MESHRL_PARENT_PID"
PR_SET_PDEATHSIG = 1


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    return {**(os.environ if env is None else env), VAR: str(os.getpid())}


def die_with_parent() -> bool:
    """SIGTERM to this process when the parent named in MESHRL_PARENT_PID dies; True if armed."""
    parent = os.environ.pop(VAR, "")  # not inherited by this process's own children
    if not parent or not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        return False
    if os.getppid() != int(parent):  # it died before the signal was armed
        os.kill(os.getpid(), signal.SIGTERM)
    return True


def serve_child(args: list[str], timeout: float = 60.0) -> tuple[subprocess.Popen, str]:
    """`meshrl serve ARGS --port 0` as a child that dies with this process, and the address it listens on;
    RuntimeError when it does not start. What it prints after that goes to this process's stderr."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", "serve", *args, "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
        start_new_session=True,  # Ctrl-C reaches its parent, which stops it
    )
    assert proc.stdout is not None
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    try:
        for line in proc.stdout:
            if "listening on" in line:
                threading.Thread(target=forward, args=(proc.stdout,), daemon=True).start()
                return proc, line.split()[-1]
            sys.stderr.write(line)
    finally:
        timer.cancel()
    raise RuntimeError(f"`meshrl serve {' '.join(args)}` did not start (exit code {proc.wait()})")


def forward(stream) -> None:
    """A child's output to this process's stderr, line by line: a pipe nobody reads would block its writer."""
    for line in stream:
        sys.stderr.write(line)


def running(pid: int) -> bool:
    """Whether process `pid` lives here (a zombie counts as gone: it holds no files and maps nothing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    try:  # "PID (name) STATE ..."
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return True
