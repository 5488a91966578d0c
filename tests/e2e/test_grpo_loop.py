"""The GRPO loop end to end through real services it starts itself (HF rollout, 2-rank actor, reward)."""

import json

import yaml

from orchestrator.config import load_config
from orchestrator.grpo import run


def test_grpo_runs_steps_and_logs_them(tiny_lm, arithmetic_data, tmp_path):
    cfg = load_config(None, [f"actor.model={tiny_lm}", f"data.train_files={arithmetic_data['train']}",
                             f"trainer.run_dir={tmp_path}", "trainer.total_steps=2", "data.train_batch_size=4",
                             "rollout.n=2", "rollout.backend=hf", "actor.world_size=2", "reward.workers=1"])
    run_dir = run(cfg)
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2]
    for m in lines:
        assert {"critic/score/mean", "actor/pg_loss", "response_length/mean", "timing_s/gen"} <= set(m)
        assert m["rollout/kl_to_actor"] < 1e-4  # the rollout runs the weights the actor just pushed
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["rollout"]["n"] == 2
