"""The multi-turn benchmark's environment: every tool call sleeps a random 0-200 ms (a slow tool), and an
episode lasts TURNS turns whatever the policy writes, so each trajectory makes the same calls."""

import random
import time

TURNS = 3


class Sleepy:
    def reset(self, task, seed=None):
        self.rng, self.turns = random.Random(seed), 0
        return ""

    def step(self, action):
        self.turns += 1
        time.sleep(self.rng.uniform(0.0, 0.2))
        done = self.turns >= TURNS
        return ("" if done else f" <result>{self.turns}</result>"), float(done), done, {"tool_calls": self.turns}
