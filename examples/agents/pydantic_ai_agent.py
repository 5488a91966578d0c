"""The calculator task's agent written with pydantic-ai at its defaults for an OpenAI-compatible server,
as pydantic-ai's docs write one: `OpenAIChatModel` with an `OpenAIProvider` at the server's address
(`POST /v1/chat/completions`, the tools listed, tool_choice auto), a plain tool from a decorated
function, text output, `run_sync`. It runs in a venv of its own, where meshrl is not installed
(docs/agents.md), from the checkout's root (the calculator is services/env/calculator.py, standard
library only):

    bash scripts/hub_venv.sh pydantic-ai-slim 'pydantic-ai-slim[openai]'     # prints PY, the venv's python
    meshrl grpo ... rollout.agent=examples/agents/pydantic_ai_agent.py:agent rollout.agent_python=$PY

The reward is the calculator environment's on the output. A run the policy ends badly (a tool it does
not have or arguments that do not validate, past pydantic-ai's retries; past the request limit) scores
0, as a wrong answer would; any other failure (the endpoint refusing) raises, and the run counts the
episode lost.
"""

from openai import AsyncOpenAI
from pydantic_ai import Agent
from pydantic_ai.exceptions import UnexpectedModelBehavior, UsageLimitExceeded
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.usage import UsageLimits

from services.env.calculator import Calculator

MAX_CALLS = 4


def agent(task: dict, base_url: str, api_key: str) -> dict:
    env = Calculator()
    env.reset(task)
    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)  # an episode's own key
    solver = Agent(OpenAIChatModel("policy", provider=OpenAIProvider(openai_client=client)))

    @solver.tool_plain
    def calculator(expression: str) -> str:
        """Evaluate an integer arithmetic expression with + - * // % and parentheses, such as 12*7."""
        return env.call("calculator", {"expression": expression})

    question = task["prompt"][-1]["content"]
    try:
        result = solver.run_sync(question, usage_limits=UsageLimits(request_limit=MAX_CALLS))
    except (UnexpectedModelBehavior, UsageLimitExceeded):
        return {"reward": 0.0, "acc": False, "tool_calls": env.calls}
    _, reward, _, info = env.step(str(result.output))
    return {"reward": reward, "acc": bool(info.get("acc")), "tool_calls": env.calls}
