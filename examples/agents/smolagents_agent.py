"""The calculator task's agent written with smolagents at its defaults: a `ToolCallingAgent` over
`OpenAIServerModel` (`POST /v1/chat/completions`, content as text parts, the tools and smolagents'
`final_answer` tool listed with `tool_choice: "required"` on every call, its stop strings), a tool from a
decorated function, `run`. It runs in a venv of its own, where meshrl is not installed (docs/agents.md),
from the checkout's root (the calculator is services/env/calculator.py, standard library only):

    bash scripts/hub_venv.sh smolagents     # prints PY, the venv's python
    meshrl grpo ... rollout.agent=examples/agents/smolagents_agent.py:agent rollout.agent_python=$PY

One setting is not smolagents' default, the system prompt: its own is 3,800 characters of examples for
large instruction-tuned models, more than a small policy's context holds; a short one stands in its place.

The endpoint serves `tool_choice: "required"` by its stated rule (docs/agents.md): the model writes
unconstrained, and smolagents decides what a reply without a call means (an error it shows the model,
then another step; past max_steps, one last call for the answer). The reward is the calculator
environment's on the final answer. A run the policy ends badly (its conversation outgrows the model's
context: the endpoint's 400 `context_length_exceeded`) scores 0, as a wrong answer would; any other
failure raises, and the run counts the episode lost.
"""

import importlib.resources

import openai
import yaml
from smolagents import OpenAIServerModel, Tool, ToolCallingAgent

from services.env.calculator import Calculator

MAX_STEPS = 2
TEMPLATES = yaml.safe_load((importlib.resources.files("smolagents.prompts") / "toolcalling_agent.yaml").read_text())
TEMPLATES["system_prompt"] = "Solve the task with the tools. Call final_answer with the answer."


class CalculatorTool(Tool):
    name = "calculator"
    description = "Evaluate an integer arithmetic expression with + - * // % and parentheses, such as 12*7."
    inputs = {"expression": {"type": "string", "description": "the expression"}}
    output_type = "string"

    def __init__(self, env: Calculator):
        super().__init__()
        self.env = env

    def forward(self, expression: str) -> str:
        return self.env.call("calculator", {"expression": expression})


def agent(task: dict, base_url: str, api_key: str) -> dict:
    env = Calculator()
    env.reset(task)
    model = OpenAIServerModel("policy", api_base=base_url, api_key=api_key, client_kwargs={"max_retries": 0})
    solver = ToolCallingAgent(
        tools=[CalculatorTool(env)], model=model, max_steps=MAX_STEPS, prompt_templates=TEMPLATES, verbosity_level=0
    )
    try:
        answer = solver.run(task["prompt"][-1]["content"])
    except Exception as e:  # smolagents wraps the client's error in its own
        if isinstance(e.__cause__, openai.BadRequestError) and e.__cause__.code == "context_length_exceeded":
            return {"reward": 0.0, "acc": False, "tool_calls": env.calls}
        raise
    _, reward, _, info = env.step(str(answer))
    return {"reward": reward, "acc": bool(info.get("acc")), "tool_calls": env.calls}
