"""Processes that die with the process that started them: no service outlives a killed orchestrator,
no actor rank outlives its rank 0.

The parent puts its pid in MESHRL_PARENT_PID (child_env); the child calls die_with_parent() first
thing. On Linux the kernel then sends the child SIGTERM when the parent dies, kill -9 included (the
services stop cleanly on SIGTERM); a parent already gone is noticed at once. Elsewhere nothing is done.
"""

import ctypes
import os
import signal
import sys

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
