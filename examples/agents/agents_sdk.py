"""The calculator task's agent written with the OpenAI Agents SDK (`openai-agents`) at its defaults: the
SDK's default model class (OpenAIResponsesModel: `POST /v1/responses`), a tool from a decorated function,
Runner.run. It runs in a venv of its own, where meshrl is not installed (docs/agents.md):

    bash scripts/hub_venv.sh openai-agents          # prints PY, the venv's python
    meshrl grpo ... rollout.agent=examples/agents/agents_sdk.py:agent rollout.agent_python=$PY

The reward: 1 when the final output is the row's ground truth. A run the policy itself ends badly (a tool
it does not have, arguments that are not JSON, past max turns) scores 0, as a wrong answer would; any
other failure (the endpoint refusing) raises, and the run counts the episode lost.
"""

import ast
import asyncio
import operator

from agents import Agent, Runner, function_tool, set_tracing_disabled
from agents.exceptions import MaxTurnsExceeded, ModelBehaviorError
from agents.models.openai_responses import OpenAIResponsesModel
from openai import AsyncOpenAI

set_tracing_disabled(True)  # the SDK would otherwise send each run's trace to OpenAI's servers
MAX_TURNS = 4
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def evaluate(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in OPS:
        return OPS[type(node.op)](evaluate(node.left), evaluate(node.right))
    raise ValueError("only integers with + - *")


@function_tool
def calculator(expression: str) -> str:
    """Evaluate an integer arithmetic expression with + - *, such as 12*7."""
    try:
        return str(evaluate(ast.parse(expression, mode="eval").body))
    except (SyntaxError, ValueError, RecursionError) as e:
        return f"error: {e}"


def agent(task: dict, base_url: str, api_key: str) -> dict:
    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)  # an episode's own key
    solver = Agent(name="calculator", tools=[calculator], model=OpenAIResponsesModel("policy", client))
    try:
        result = asyncio.run(Runner.run(solver, task["prompt"], max_turns=MAX_TURNS))
    except (MaxTurnsExceeded, ModelBehaviorError):
        return {"reward": 0.0, "acc": False}
    right = str(result.final_output).strip() == str(task["ground_truth"]).strip()
    return {"reward": float(right), "acc": right}
