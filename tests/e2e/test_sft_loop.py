"""The SFT loop through a real actor service: the loss on the answers falls, a HF model comes out."""

import json

from transformers import AutoModelForCausalLM

from orchestrator.config import load_config
from orchestrator.main import run


def test_sft_lowers_the_loss_and_exports_a_model(tiny_lm, arithmetic_data, tmp_path):
    cfg = load_config(
        None,
        [
            f"actor.model={tiny_lm}",
            f"data.train_files={arithmetic_data['train']}",
            f"trainer.run_dir={tmp_path}",
            "trainer.total_steps=30",
            "data.train_batch_size=16",
            "actor.lr=1e-3",
            "actor.micro_batch_size=16",
            "actor.engine=plain",
        ],
    )
    run_dir = run("sft", cfg)
    losses = [json.loads(line)["actor/sft_loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 30 and sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5
    assert AutoModelForCausalLM.from_pretrained(run_dir / "hf").config.model_type == "llama"
