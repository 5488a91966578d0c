"""Environments for the env service's tests, loaded by the service from this file
("tests/contract/env_scripted.py:Scripted"), as a user's environment file is.

MESHRL_TEST_ENV_BROKEN=1 in the environment makes importing this file fail: a test sets it to stop
the service from starting replacement workers.
"""

import os
import time

if os.environ.get("MESHRL_TEST_ENV_BROKEN") == "1":
    raise RuntimeError("broken on purpose (MESHRL_TEST_ENV_BROKEN=1)")


class Scripted:
    """Does what the action says: crash, refuse, hang, exit its process, or answer with a wrong type."""

    STOP = ["</tool>"]

    def reset(self, task, seed=None):
        return f"task {task.get('n', 0)} seed {seed}", {"ready": True}

    def step(self, action):
        if action == "crash":
            raise RuntimeError("the tool fell over")
        if action == "refuse":
            raise ValueError("no such tool")
        if action == "hang":
            time.sleep(5)
        if action == "forever":
            time.sleep(10**6)
        if action == "exit":
            os._exit(3)  # a tool that takes its process down (a segfault, an out-of-memory kill)
        if action == "bad-type":
            return 42, 0.0, False, {}
        if action == "bad-reward":
            return "x", float("nan"), False, {}
        if action == "short":
            return "x", 0.0
        return f"echo {action}", 0.5, action == "done", {"len": len(action)}
