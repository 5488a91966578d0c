"""A mixture of experts through a GRPO run with routing replay R3 (tiny Qwen3-MoE, hf rollout, two FSDP2
actor ranks): every Generate returns the experts each token was routed to, they reach the update beside
the tokens (joined over the step's chunks), and the update's two mini-batches run on them; the rollout
stays in parity with the actor after each push, and the agreement of the actor's own routing with the
rollout's is reported."""

import json

from meshrl.tiny.models import TinyModelConfig, make_model
from orchestrator.config import load_config
from orchestrator.main import run


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
