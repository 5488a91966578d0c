"""Environments for the env service's tests, loaded by the service's worker processes from this file
("tests/contract/env_scripted.py:Scripted"), as a user's environment file is: Scripted, which does what
an action says, and Turns, which plays fixed turns (the multi-turn sampler's tests).

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


class Turns:
    """Answers turn k with "result k"; done after DONE_AT turns; the task "crash" fails at its second turn
    (tests/contract/test_multi_turn.py)."""

    DONE_AT = 3

    def reset(self, task, seed=None):
        self.task, self.turns = task, 0
        return "start" if task["extra_info"]["index"] % 2 else ""

    def step(self, action):
        self.turns += 1
        if self.task["ground_truth"] == "crash" and self.turns == 2:
            raise RuntimeError("the tool fell over")
        done = self.turns >= self.DONE_AT
        return ("" if done else f" result {self.turns}"), 0.25, done, {"tool_calls": self.turns}
