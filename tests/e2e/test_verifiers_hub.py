"""A verifiers environment (prime-rl's `verifiers` package, issue 61) trained as it is, end to end: the
hub's own venv built from its pins (scripts/hub_venv.sh, meshrl not in it), an environment package
installed there as verifiers' users install theirs (examples/hubs/verifiers/environments/vf_sums), its
datasets written by examples/hubs/verifiers/meshrl_verifiers.py `data`, then GRPO
(configs/verifiers_grpo.yaml) whose every episode is the environment's own `run_rollout` and rubric,
played in that venv against the run's endpoint with a Qwen2.5-shaped tiny model and its ChatML template.

Every episode is played and recorded (none lost), the rollout's log-probs of what the endpoint recorded
are the actor's at the parity level of every other path, and each sample's score is the rubric's on
exactly the recorded reply."""

import json
import pathlib
import subprocess

import pandas as pd
import pytest

from orchestrator.config import load_config
from orchestrator.main import run
from testkit.tool_task import check_agent_steps

ROOT = pathlib.Path(__file__).resolve().parents[2]
HUB = ROOT / "examples/hubs/verifiers"
STEPS = 3


def rubric(reply: str, answer: str) -> float:
    """vf_sums's rubric, written again: exact (weight 1) and the share of digits (weight 0.5)."""
    digits = sum(c.isdigit() for c in reply) / len(reply) if reply else 0.0
    return float(reply.strip() == answer) + 0.5 * digits


@pytest.mark.slow
@pytest.mark.timeout(900)  # the hub's venv: ~30 s from uv's cache, longer where its packages download
def test_a_verifiers_environment_trains_as_it_is(tmp_path, bpe_lm):
    made = subprocess.run(
        ["bash", str(ROOT / "scripts/hub_venv.sh"), "verifiers", str(HUB / "environments/vf_sums")],
        capture_output=True,
        text=True,
        timeout=800,
    )
    assert made.returncode == 0, made.stderr[-3000:]
    python = made.stdout.strip().splitlines()[-1]
    data = tmp_path / "data"
    subprocess.run([python, str(HUB / "meshrl_verifiers.py"), "data", "vf_sums", str(data)], check=True, timeout=300)
    train = pd.read_parquet(data / "train.parquet")
    assert len(train) == 64 and list(train.iloc[0]["prompt"][0]) == ["role", "content"]
    out = run(
        "grpo",
        load_config(
            str(ROOT / "configs/verifiers_grpo.yaml"),
            [
                f"rollout.agent={HUB / 'meshrl_verifiers.py'}:agent",
                f"rollout.agent_python={python}",
                f"actor.model={bpe_lm}",
                f"data.train_files={data / 'train.parquet'}",
                f"data.val_files={data / 'test.parquet'}",
                f"trainer.run_dir={tmp_path / 'grpo'}",
                f"trainer.total_steps={STEPS}",
                f"trainer.val_every={STEPS}",
                "data.train_batch_size=4",
                "rollout.n=4",
                "rollout.max_new_tokens=8",
                "actor.engine=plain",
                "actor.world_size=1",
                "trainer.trace=",
            ],
        ),
    )
    check_agent_steps(out, steps=STEPS)
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert samples and all(s["messages"][-1]["content"].endswith("=") for s in samples)
    for s in samples:  # the rubric scored what was recorded and trained on
        assert s["score"] == pytest.approx(rubric(s["response"], s["ground_truth"]), abs=1e-6), s
    assert len({s["score"] for s in samples}) > 1  # the scores differ: the update had something to follow
