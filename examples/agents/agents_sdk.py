"""The calculator task's agent written with the OpenAI Agents SDK (`openai-agents`) at its defaults: the
SDK's default model class (OpenAIResponsesModel: `POST /v1/responses`), a tool from a decorated function,
Runner.run. It runs in a venv of its own, where meshrl is not installed (docs/agents.md), from the
checkout's root (the run's folder comes first on the agent's path: the calculator is
services/env/calculator.py, standard library only):

    bash scripts/hub_venv.sh openai-agents          # prints PY, the venv's python
    meshrl grpo ... rollout.agent=examples/agents/agents_sdk.py:agent rollout.agent_python=$PY

The reward is the calculator environment's on the final output. A run the policy itself ends badly (a
tool it does not have, arguments that are not JSON, past max turns) scores 0, as a wrong answer would;
any other failure (the endpoint refusing) raises, and the run counts the episode lost.
"""

import asyncio

from agents import Agent, Runner, function_tool, set_tracing_disabled
from agents.exceptions import MaxTurnsExceeded, ModelBehaviorError
from agents.models.openai_responses import OpenAIResponsesModel
from openai import AsyncOpenAI

from services.env.calculator import Calculator

set_tracing_disabled(True)  # the SDK would otherwise send each run's trace to OpenAI's servers
MAX_TURNS = 4


def agent(task: dict, base_url: str, api_key: str) -> dict:
    env = Calculator()
    env.reset(task)

    @function_tool
    def calculator(expression: str) -> str:
        """Evaluate an integer arithmetic expression with + - * // % and parentheses, such as 12*7."""
        return env.call("calculator", {"expression": expression})

    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)  # an episode's own key
    solver = Agent(name="calculator", tools=[calculator], model=OpenAIResponsesModel("policy", client))
    try:
        result = asyncio.run(Runner.run(solver, task["prompt"], max_turns=MAX_TURNS))
    except (MaxTurnsExceeded, ModelBehaviorError):
        return {"reward": 0.0, "acc": False, "tool_calls": env.calls}
    _, reward, _, info = env.step(str(result.final_output))
    return {"reward": reward, "acc": bool(info.get("acc")), "tool_calls": env.calls}
