"""A mixture of experts through a GRPO run with routing replay R3 (tiny Qwen3-MoE, hf rollout, two FSDP2
actor ranks): every Generate returns the experts each token was routed to, they reach the update beside
the tokens (joined over the step's chunks), and the update's two mini-batches run on them; the rollout
stays in parity with the actor after each push, and the agreement of the actor's own routing with the
rollout's is reported. And the main job's recipe on a Qwen3-MoE (8 experts, top 2), warm-up and GRPO with
R3, learns by the learning tests' bar."""

import json

import pytest

from meshrl.tiny.arithmetic import ArithmeticConfig, make_data
from meshrl.tiny.models import TinyModelConfig, make_model
from orchestrator.config import load_config
from orchestrator.main import run
from testkit.recipe import check_gain, steps_run, warm_up_and_grpo

GAIN_Z = 4.0  # tests/e2e/test_learning.py's bar, in paired standard errors (15.6 seen at 80 steps here)


def test_grpo_with_rollout_routing_replay(arithmetic_data, tmp_path):
    model = make_model(tmp_path / "moe", TinyModelConfig(family="qwen3_moe", num_experts=4))
    cfg = load_config(
        None,
        [
            f"actor.model={model}",
            f"data.train_files={arithmetic_data['train']}",
            f"trainer.run_dir={tmp_path / 'run'}",
            "trainer.total_steps=2",
            "trainer.val_every=0",
            "data.train_batch_size=4",
            "rollout.n=2",
            "rollout.backend=hf",
            "rollout.chunks=2",
            "actor.world_size=2",
            "actor.mini_batch_size=4",  # two optimizer steps: the second replays after the weights moved
            "actor.router_replay=r3",
            "reward.workers=1",
        ],
    )
    run_dir = run("grpo", cfg)
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2]
    for m in lines:
        assert m["rollout/kl_to_actor"] < 1e-4  # the actor scores what the rollout ran
        assert 0.5 < m["actor/moe/routing_agreement"] <= 1.0


@pytest.mark.slow
def test_the_main_jobs_recipe_on_a_mixture_of_experts_learns_with_routing_replay(tmp_path):
    """The SFT warm-up and 40 GRPO steps (configs/arithmetic_*.yaml, as the main job runs them) on a tiny
    Qwen3-MoE with R3 on the hf rollout: held-out greedy accuracy rises by GAIN_Z standard errors, with the
    rollout in parity with the actor and the replayed experts agreeing with the actor's own choice on the
    rollout's weights (about 2 in 100 differ after an update's first optimizer step)."""
    model = make_model(tmp_path / "moe", TinyModelConfig(family="qwen3_moe", num_experts=8, experts_per_token=2))
    data = make_data(tmp_path / "data", ArithmeticConfig())  # the main job's task: 500 held-out problems
    steps = 40
    grpo = warm_up_and_grpo("arithmetic", tmp_path, model, data, steps, "actor.router_replay=r3")
    check_gain(grpo, 500, GAIN_Z)
    logged = steps_run(grpo)
    assert len(logged) == steps and logged[0]["rollout/kl_to_actor"] < 1e-4
    assert all(0.9 < m["actor/moe/routing_agreement"] <= 1.0 for m in logged)
