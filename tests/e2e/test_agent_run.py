"""A run whose samples are an OpenAI-SDK agent's episodes (rollout.agent, issue 44), end to end: the
calculator agent (examples/agents/calculator.py) in worker processes, the run's endpoint in front of a
real rollout service (hf backend), a Qwen2.5-shaped tiny model with its ChatML template, GRPO with an
actor service. Every episode is played and recorded (none lost), the rollout's log-probs of what it
recorded agree with the actor's at the parity level of every other path, and a Ctrl-C-free way out
leaves no agent worker behind. (That the recording is the environment path's trajectory token for
token: tests/contract/test_multi_turn_tools.py.)"""

import json
import os
import pathlib
import subprocess

import pytest
from node_example import needs_node

from meshrl.tiny.arithmetic import ArithmeticConfig, make_data
from orchestrator.config import load_config
from orchestrator.main import run

ROOT = pathlib.Path(__file__).resolve().parents[2]
PARITY = 1e-5  # rollout/kl_to_actor on these fp32 paths: ~1e-7 (see test_weight_sync.py)


def agent_run(tmp_path, bpe_lm, agent: list[str]) -> pathlib.Path:
    """A 2-step GRPO run on the hermes calculator task whose episodes `agent` (overrides) plays."""
    data = make_data(
        tmp_path / "data",
        ArithmeticConfig(ops="*", max_operand=99, tool=True, tool_format="hermes", num_train=32, num_test=8),
    )
    overrides = [
        f"actor.model={bpe_lm}",
        f"data.train_files={data['train']}",
        f"data.val_files={data['test']}",
        f"trainer.run_dir={tmp_path / 'grpo'}",
        "trainer.total_steps=2",
        "trainer.val_every=2",
        "trainer.trace=",
        "data.train_batch_size=4",
        "rollout.n=2",
        "rollout.multi_turn=false",
        "rollout.tool_parser=hermes",
        "rollout.max_new_tokens=32",
        "actor.engine=plain",
        "actor.world_size=1",
        *agent,
    ]
    out = run("grpo", load_config(str(ROOT / "configs/calculator_grpo.yaml"), overrides))
    check_trained(out)
    return out


def check_trained(out: pathlib.Path) -> None:
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    trained = [s for s in steps if "agent/episodes_lost" in s and "actor/pg_loss" in s]
    assert len(trained) == 2
    for s in trained:
        assert s["agent/episodes_lost"] == 0 and s["agent/calls/mean"] >= 1
        assert s["rollout/kl_to_actor"] < PARITY, s["rollout/kl_to_actor"]
    assert any("val/acc/mean" in s for s in steps)
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert samples and all(s["response"] for s in samples)


@pytest.mark.slow
def test_grpo_trains_on_an_openai_agents_episodes(tmp_path, bpe_lm):
    agent_run(tmp_path, bpe_lm, [f"rollout.agent={ROOT / 'examples/agents/calculator.py'}:agent"])
    workers = subprocess.run(["pgrep", "-f", "orchestrator.agents.worker"], capture_output=True, text=True)
    assert str(os.getpid()) not in workers.stdout and not [
        p for p in workers.stdout.split() if pathlib.Path(f"/proc/{p}/status").is_file() and _child_of_us(p)
    ]


@pytest.mark.slow
@needs_node
def test_an_agent_in_node_with_the_openai_npm_package_trains_too(tmp_path, bpe_lm):
    """The same agent written in Node.js (examples/node-agent), run as rollout.agent_command."""
    folder = ROOT / "examples/node-agent"
    subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=folder, check=True, timeout=300)
    agent_run(tmp_path, bpe_lm, [f"rollout.agent_command=node {folder / 'agent.js'}", "rollout.concurrency=4"])


def _child_of_us(pid: str) -> bool:
    """Whether process `pid` was started by this test process (its parent chain reaches us)."""
    while pid not in ("0", "1"):
        try:
            status = pathlib.Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return False
        pid = next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:"))
        if pid == str(os.getpid()):
            return True
    return False
