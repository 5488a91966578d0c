"""The bundled visual task through the whole mesh: a tiny Qwen2-VL (meshrl make-model --family qwen2_vl), its
pictures read from verl's multimodal schema, an SFT warm-up and GRPO (configs/visual_*.yaml) with the hf
rollout generating from the pictures, the reward service scoring the answers, and the actor training the
language model and the vision tower. Held-out greedy accuracy on pictures never trained on rises by the
learning tests' bar, and the rollout stays in parity with the actor."""

import json
import pathlib

from meshrl.tiny.models import TinyModelConfig, make_model
from meshrl.tiny.visual import VisualConfig, make_data
from orchestrator.config import load_config
from orchestrator.main import run
from orchestrator.output.report import gain_line, held_out_gain

ROOT = pathlib.Path(__file__).resolve().parents[2]
GAIN_Z = 4.0  # tests/e2e/test_learning.py's bar, in paired standard errors (6.1 seen at 60 steps here)


def test_the_visual_task_learns_from_pictures(tmp_path):
    common = ["actor.engine=plain", "actor.world_size=1", "reward.workers=1", "trainer.trace="]
    model = make_model(tmp_path / "model", TinyModelConfig(family="qwen2_vl"))
    data = make_data(tmp_path / "data", VisualConfig())  # 300 held-out pictures
    sft = run(
        "sft",
        load_config(
            str(ROOT / "configs/visual_sft.yaml"),
            [*common, f"data.train_files={data['train']}", f"actor.model={model}", f"trainer.run_dir={tmp_path}/sft"],
        ),
    )
    steps = 60
    grpo = run(
        "grpo",
        load_config(
            str(ROOT / "configs/visual_grpo.yaml"),
            [
                *common,
                f"data.train_files={data['train']}",
                f"data.val_files={data['test']}",
                f"actor.model={sft / 'hf'}",
                f"trainer.run_dir={tmp_path / 'grpo'}",
                f"trainer.total_steps={steps}",
                f"trainer.val_every={steps}",
            ],
        ),
    )
    gain = held_out_gain(grpo)
    assert gain is not None and gain["n"] == 300
    assert gain["gain"] > 0 and gain["gain"] >= GAIN_Z * gain["gain_se"], gain_line(gain)
    lines = [json.loads(line) for line in (grpo / "metrics.jsonl").read_text().splitlines()]
    steps_run = [m for m in lines if m["step"] > 0]  # step 0's line holds the first validation only
    assert len(steps_run) == steps and all(m["rollout/kl_to_actor"] < 1e-4 for m in steps_run)
