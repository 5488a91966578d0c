"""The calculator task's agent written with LangChain at its defaults: `create_agent` (LangChain 1.x's
agent loop, on LangGraph) over `ChatOpenAI`, whose default is `POST /v1/chat/completions` with the tools
listed and no tool_choice, and a tool from a decorated function. It runs in a venv of its own, where
meshrl is not installed (docs/agents.md), from the checkout's root (the calculator is
services/env/calculator.py, standard library only):

    bash scripts/hub_venv.sh langchain langchain-openai     # prints PY, the venv's python
    meshrl grpo ... rollout.agent=examples/agents/langchain_agent.py:agent rollout.agent_python=$PY

The reward is the calculator environment's on the last message. A run the policy ends badly (past the
step limit) scores 0, as a wrong answer would; a call to a tool it does not have is answered with
LangChain's error message as the tool's result; any other failure (the endpoint refusing) raises, and
the run counts the episode lost.
"""

from langchain.agents import create_agent
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError

from services.env.calculator import Calculator

MAX_CALLS = 4  # model calls an episode may make: a LangGraph step for each, and one for each tool round


def agent(task: dict, base_url: str, api_key: str) -> dict:
    env = Calculator()
    env.reset(task)

    @tool
    def calculator(expression: str) -> str:
        """Evaluate an integer arithmetic expression with + - * // % and parentheses, such as 12*7."""
        return env.call("calculator", {"expression": expression})

    model = ChatOpenAI(model="policy", base_url=base_url, api_key=api_key, max_retries=0)  # an episode's own key
    graph = create_agent(model, tools=[calculator])
    try:
        state = graph.invoke({"messages": task["prompt"]}, {"recursion_limit": 2 * MAX_CALLS})
    except GraphRecursionError:
        return {"reward": 0.0, "acc": False, "tool_calls": env.calls}
    _, reward, _, info = env.step(state["messages"][-1].text)
    return {"reward": reward, "acc": bool(info.get("acc")), "tool_calls": env.calls}
