"""An OpenEnv environment written as OpenEnv's template writes one (an Environment with its Action and
Observation models, served by openenv's create_app over HTTP and WebSocket), small enough for meshrl's
tiny models: reset(seed) poses a sum, step(message) scores the reply (1 when right, plus half the share of
its characters that are digits) and ends the episode. Served with

    PY -m uvicorn sums_env:app --host 127.0.0.1 --port 8000

and trained through examples/hubs/openenv/meshrl_openenv.py (docs/agents.md, "Environment hubs")."""

import random
import uuid

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class SumsAction(Action):
    message: str = Field(..., description="the reply")


class SumsObservation(Observation):
    prompt: str = Field(default="", description="the problem, e.g. 12+7=")
    acc: bool = Field(default=False, description="whether the reply was right")


class SumsEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True  # each WebSocket session has its own instance

    def __init__(self):
        super().__init__()
        self._state = State(episode_id=str(uuid.uuid4()), step_count=0)
        self.answer = ""

    def reset(self, seed=None, episode_id=None, **kwargs) -> SumsObservation:
        rng = random.Random(seed)
        a, b = rng.randint(0, 49), rng.randint(0, 49)
        self.answer = str(a + b)
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        return SumsObservation(prompt=f"{a}+{b}=", done=False, reward=0.0)

    def step(self, action: SumsAction, timeout_s=None, **kwargs) -> SumsObservation:
        self._state.step_count += 1
        text = action.message
        digits = sum(c.isdigit() for c in text) / len(text) if text else 0.0
        reward = float(text.strip() == self.answer) + 0.5 * digits
        return SumsObservation(prompt="", done=True, reward=reward, acc=text.strip() == self.answer)

    @property
    def state(self) -> State:
        return self._state


app = create_app(SumsEnvironment, SumsAction, SumsObservation, env_name="sums_env", max_concurrent_envs=64)
