"""Agents written with the frameworks users have, at the frameworks' defaults, trained through the run's
endpoint (issue 58): each framework in a pinned venv of its own (scripts/hub_venv.sh, meshrl not in it),
its calculator agent in examples/agents/, one GRPO step on the hermes calculator task with a
Qwen2.5-shaped tiny model. Every episode is played and recorded (none lost: the endpoint answers what
the framework's defaults send) and the rollout's log-probs of what was recorded are the actor's at the
parity level of every other path.

- The OpenAI Agents SDK (`openai-agents`, examples/agents/agents_sdk.py): its default model class,
  OpenAIResponsesModel, so every call is `POST /v1/responses` with the tool as a function tool.
- LangChain (`langchain` with `langchain-openai`, examples/agents/langchain_agent.py): `create_agent`
  over ChatOpenAI, chat completions with the tools bound.
- smolagents (examples/agents/smolagents_agent.py): ToolCallingAgent over OpenAIServerModel, content
  as text parts, `tool_choice: "required"` and the `final_answer` tool on every call, stop strings, and
  one last call without tools past max_steps. Its calls are longer than the others' (two tools' schemas
  in the prompt): the run takes the model's 512 positions.
- pydantic-ai (`pydantic-ai-slim[openai]`, examples/agents/pydantic_ai_agent.py): OpenAIChatModel
  with an OpenAIProvider, as its docs write one for an OpenAI-compatible server.
"""

import pathlib

import pytest

from testkit.tool_task import agent_step
from testkit.venvs import pinned_python

ROOT = pathlib.Path(__file__).resolve().parents[2]


FRAMEWORKS = {  # name: (its venv's hub and extra packages, its agent file, the run's extra settings)
    "openai-agents": (("openai-agents",), "agents_sdk.py", ()),
    "langchain": (("langchain", "langchain-openai"), "langchain_agent.py", ()),
    "smolagents": (("smolagents", "openai"), "smolagents_agent.py", ("rollout.max_model_len=512",)),
    "pydantic-ai": (("pydantic-ai-slim", "pydantic-ai-slim[openai]"), "pydantic_ai_agent.py", ()),
}


@pytest.mark.slow
@pytest.mark.timeout(900)  # the framework's venv: seconds from uv's cache, longer where its packages download
@pytest.mark.parametrize("framework", list(FRAMEWORKS))
def test_an_agent_written_with_a_framework_at_its_defaults_trains(tmp_path, bpe_lm, framework):
    venv, agent, settings = FRAMEWORKS[framework]
    python = pinned_python(*venv)
    agent_step(
        tmp_path,
        bpe_lm,
        [f"rollout.agent={ROOT / 'examples/agents' / agent}:agent", f"rollout.agent_python={python}", *settings],
    )
