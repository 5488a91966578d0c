"""An environment for tests/e2e/test_weight_sync.py's multi-turn test on vLLM, loaded by the env service's
worker processes from this file as a user's environment is: turns end at characters the tiny model
samples (STOP), and every action it is given is appended, as a JSON line, to the file
MESHRL_TEST_TAGGED names (the test reads what the environment saw)."""

import json
import os


class Tagged:
    STOP = ["3", "5", "7"]  # characters the tiny model samples: some turns end at one (with one stop
    # string, a run whose turns the batcher grouped otherwise once had none end there)

    def reset(self, task, seed=None):
        self.turns = 0
        return ""

    def step(self, action):
        with open(os.environ["MESHRL_TEST_TAGGED"], "a") as f:
            f.write(json.dumps(action) + "\n")
        self.turns += 1
        return " ok", 0.5, self.turns >= 3, {"tool_calls": self.turns}
