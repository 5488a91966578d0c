"""The environment hubs users already have (issue 61), each trained as it is, end to end: the hub's own
venv built from its pins (scripts/hub_venv.sh, meshrl not in it), an environment package installed there
as the hub's users install theirs, its problems written as meshrl's data by the hub's bridge
(examples/hubs/HUB/meshrl_HUB.py `data`), then GRPO whose every episode the bridge plays in that venv
against the run's endpoint, with a Qwen2.5-shaped tiny model and its ChatML template:

- verifiers (configs/verifiers_grpo.yaml): the environment's own rollout and rubric
  (examples/hubs/verifiers/environments/vf_sums), with a group reward: each group scored together;
- OpenEnv (configs/openenv_grpo.yaml): the environment's server (examples/hubs/openenv/environments/
  sums_env, served by uvicorn as OpenEnv serves its environments), reset and stepped through OpenEnv's
  own client.

Every episode is played and recorded (none lost), the rollout's log-probs of what the endpoint recorded
are the actor's at the parity level of every other path, and each sample's score is the environment's
on exactly the recorded reply (both environments score a sum the same way: `reward` below)."""

import json
import pathlib
import re
import subprocess
import time

import pytest

from orchestrator.config import load_config
from orchestrator.main import run
from testkit.tool_task import check_agent_steps
from testkit.venvs import pinned_python

ROOT = pathlib.Path(__file__).resolve().parents[2]
HUBS = ROOT / "examples/hubs"
STEPS = 3
GROUP = 4  # rollout.n
UNIQUE = 0.25  # the weight of vf_sums' group reward: a reply no other reply of its group gave


def reward(reply: str, answer: str) -> float:
    """Both example environments' score, written again: 1 when right, plus half the share of digits."""
    digits = sum(c.isdigit() for c in reply) / len(reply) if reply else 0.0
    return float(reply.strip() == answer) + 0.5 * digits


def train(tmp_path, model, config: str, python: str, data: pathlib.Path, suffix: str) -> list[dict]:
    """STEPS of GRPO on the hub's data; the samples, after the checks every agent run passes."""
    out = run(
        "grpo",
        load_config(
            str(ROOT / "configs" / config),
            [
                f"rollout.agent_python={python}",
                f"actor.model={model}",
                f"data.train_files={data / f'train.{suffix}'}",
                f"data.val_files={data / f'test.{suffix}'}",
                f"trainer.run_dir={tmp_path / 'grpo'}",
                f"trainer.total_steps={STEPS}",
                f"trainer.val_every={STEPS}",
                "data.train_batch_size=4",
                f"rollout.n={GROUP}",
                "trainer.samples_per_step=16",  # every sample of a step: the checks below read them all
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
    assert len({s["score"] for s in samples}) > 1  # the scores differ: the update had something to follow
    return samples


def answer(problem: str) -> str:
    a, b = problem.rstrip("=").split("+")
    return str(int(a) + int(b))


@pytest.mark.slow
@pytest.mark.timeout(900)  # the hub's venv: ~30 s from uv's cache, longer where its packages download
def test_a_verifiers_environment_trains_as_it_is(tmp_path, bpe_lm):
    python = pinned_python("verifiers", str(HUBS / "verifiers/environments/vf_sums"))
    data = tmp_path / "data"
    bridge = HUBS / "verifiers/meshrl_verifiers.py"
    args = json.dumps({"unique_weight": UNIQUE})  # with a group reward: each group scored together
    subprocess.run([python, str(bridge), "data", "vf_sums", str(data), "--args", args], check=True, timeout=300)
    samples = train(tmp_path, bpe_lm, "verifiers_grpo.yaml", python, data, "parquet")
    for at in range(0, len(samples), GROUP):  # a step's samples in order: its groups, each rollout.n long
        group = samples[at : at + GROUP]
        assert len({s["messages"][-1]["content"] for s in group}) == 1  # one prompt's
        replies = [s["response"].strip() for s in group]
        for s, reply in zip(group, replies):
            # the rubric scored what was recorded and trained on, the group reward over the whole group
            want = reward(s["response"], s["ground_truth"]) + UNIQUE * (replies.count(reply) == 1)
            assert s["score"] == pytest.approx(want, abs=1e-6), (s, replies)


def listening(server: subprocess.Popen, log: pathlib.Path) -> str:
    """The address uvicorn says it serves on, once it says so."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = re.search(r"Uvicorn running on (http://\S+)", log.read_text())
        if found:
            return found.group(1)
        assert server.poll() is None, f"the environment's server exited: {log.read_text()[-2000:]}"
        time.sleep(0.1)
    raise AssertionError(f"the environment's server did not start: {log.read_text()[-2000:]}")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_an_openenv_environment_trains_as_it_is(tmp_path, bpe_lm, monkeypatch):
    python = pinned_python("openenv-core", str(HUBS / "openenv/environments/sums_env"))
    log = tmp_path / "server.log"  # a file, not a pipe: uvicorn logs every connection, and a full pipe stalls it
    with log.open("w") as sink:
        server = subprocess.Popen(
            [python, "-m", "uvicorn", "sums_env:app", "--host", "127.0.0.1", "--port", "0"], stderr=sink
        )
    try:
        monkeypatch.setenv("OPENENV_URL", listening(server, log))
        data = tmp_path / "data"
        bridge = HUBS / "openenv/meshrl_openenv.py"
        subprocess.run([python, str(bridge), "data", str(data), "--train", "64", "--test", "16"], check=True)
        for s in train(tmp_path, bpe_lm, "openenv_grpo.yaml", python, data, "jsonl"):
            # the environment's server scored what was recorded and trained on
            problem = s["messages"][-1]["content"]
            assert s["score"] == pytest.approx(reward(s["response"], answer(problem)), abs=1e-6), s
    finally:
        server.kill()
        server.wait()
