"""The learning claim, end to end on the bundled task (the main job shows it at full size): a short
SFT warm-up, then GRPO through the mesh raises greedy accuracy on held-out problems."""

import json

import pytest

from meshrl.tiny.arithmetic import ArithmeticConfig, make_data
from meshrl.tiny.models import TinyModelConfig, make_model
from orchestrator.config import load_config
from orchestrator.main import run

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_grpo_raises_held_out_accuracy(tmp_path):
    model = make_model(tmp_path / "model", TinyModelConfig())
    data = make_data(tmp_path / "data", ArithmeticConfig(ops="+", max_operand=20, num_train=2000, num_test=100))
    common = [f"data.train_files={data['train']}", "actor.engine=plain", "actor.world_size=1", "reward.workers=1"]
    sft = run("sft", load_config(str(ROOT / "configs/arithmetic_sft.yaml"), [
        *common, f"actor.model={model}", f"trainer.run_dir={tmp_path / 'sft'}", "trainer.trace="]))
    grpo = run("grpo", load_config(str(ROOT / "configs/arithmetic_grpo.yaml"), [
        *common, f"actor.model={sft / 'hf'}", f"data.val_files={data['test']}", f"trainer.run_dir={tmp_path / 'grpo'}",
        "rollout.backend=hf", "trainer.total_steps=40", "trainer.val_every=20", "trainer.trace="]))
    val = [json.loads(line)["val/acc/mean"] for line in (grpo / "metrics.jsonl").read_text().splitlines()
           if "val/acc/mean" in json.loads(line)]
    assert len(val) == 3
    assert val[-1] >= val[0] + 0.08, val  # before RL vs after 40 steps (the main job: +15 points or more)
