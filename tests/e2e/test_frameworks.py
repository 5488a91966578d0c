"""Agents written with the frameworks users have, at the frameworks' defaults, trained through the run's
endpoint (issue 58): each framework in a pinned venv of its own (scripts/hub_venv.sh, meshrl not in it),
its calculator agent in examples/agents/, one GRPO step on the hermes calculator task with a
Qwen2.5-shaped tiny model. Every episode is played and recorded (none lost: the endpoint answers what
the framework's defaults send) and the rollout's log-probs of what was recorded are the actor's at the
parity level of every other path.

- The OpenAI Agents SDK (`openai-agents`, examples/agents/agents_sdk.py): its default model class,
  OpenAIResponsesModel, so every call is `POST /v1/responses` with the tool as a function tool.
"""

import pathlib

import pytest

from meshrl.tiny.arithmetic import ArithmeticConfig, make_data
from orchestrator.config import load_config
from orchestrator.main import run
from testkit.tool_task import check_agent_steps
from testkit.venvs import pinned_python

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(900)  # the framework's venv: seconds from uv's cache, longer where its packages download
def test_an_openai_agents_sdk_agent_at_its_defaults_trains(tmp_path, bpe_lm):
    python = pinned_python("openai-agents")
    data = make_data(
        tmp_path / "data",
        ArithmeticConfig(ops="*", max_operand=99, tool=True, tool_format="hermes", num_train=32, num_test=8),
    )
    out = run(
        "grpo",
        load_config(
            str(ROOT / "configs/calculator_grpo.yaml"),
            [
                f"actor.model={bpe_lm}",
                f"data.train_files={data['train']}",
                f"data.val_files={data['test']}",
                f"trainer.run_dir={tmp_path / 'grpo'}",
                "trainer.total_steps=1",
                "trainer.val_every=1",
                "trainer.trace=",
                "data.train_batch_size=4",
                "rollout.n=2",
                "rollout.multi_turn=false",
                "rollout.tool_parser=hermes",
                "rollout.max_new_tokens=32",
                "actor.engine=plain",
                "actor.world_size=1",
                f"rollout.agent={ROOT / 'examples/agents/agents_sdk.py'}:agent",
                f"rollout.agent_python={python}",
            ],
        ),
    )
    check_agent_steps(out, steps=1)
