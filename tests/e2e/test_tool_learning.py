"""The tool claim, end to end on the bundled tool task (two-digit products, which the tiny model cannot
work out in its head): a short SFT warm-up on calculator traces teaches the call format, then GRPO over
multi-turn episodes with the calculator environment (configs/calculator_grpo.yaml) raises greedy held-out
accuracy by GAIN_Z paired standard errors, and the policy keeps calling the tool. Multi-turn sampling is
not bit-reproducible (which turns share a Generate call depends on timing), so the bar has room.

Not in the default suite (marker `unstable`; run it with `bash scripts/test.sh tests/e2e/test_tool_learning.py
-m unstable`): the claim held on the machine it was written on (+9.2 and +11.4 points, 4.6 and 5.4 standard
errors) but not on the next one, whose CPU gives the same warm-up a different start (0.714, not 0.642) and
GRPO +3.6 points (2.0 s.e.); from an 80-step warm-up +2.6 (1.7 s.e.), at twice the learning rate +1.6.
The sampled (temperature 1) training score still rose there; the greedy held-out gain in 20 steps is
what does not hold. bench/RESULTS.md has the runs."""

import json

import pytest

from meshrl.tiny.arithmetic import ArithmeticConfig, make_data
from meshrl.tiny.models import TinyModelConfig, make_model
from orchestrator.config import load_config
from orchestrator.main import run
from orchestrator.output.report import gain_line, held_out_gain

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
GAIN_Z = 3.0  # a short run: ~5 standard errors here (tests/e2e/test_learning.py asks 4 of a longer one)
SFT_STEPS = 100  # part of the way: held-out accuracy ~0.64 with the tool here (0.95 after 300 steps)
GRPO_STEPS = 20


@pytest.mark.slow
@pytest.mark.unstable
def test_grpo_with_the_calculator_answers_better(tmp_path):
    model = make_model(tmp_path / "model", TinyModelConfig())
    data = make_data(tmp_path / "data", ArithmeticConfig(ops="*", max_operand=99, tool=True))
    common = ["actor.engine=plain", "actor.world_size=1", "trainer.trace="]
    sft = run(
        "sft",
        load_config(
            str(ROOT / "configs/arithmetic_sft.yaml"),
            [
                *common,
                f"actor.model={model}",
                f"data.train_files={data['train']}",
                f"trainer.run_dir={tmp_path / 'sft'}",
                f"trainer.total_steps={SFT_STEPS}",
            ],
        ),
    )
    grpo = run(
        "grpo",
        load_config(
            str(ROOT / "configs/calculator_grpo.yaml"),
            [
                *common,
                f"actor.model={sft / 'hf'}",
                f"data.train_files={data['train']}",
                f"data.val_files={data['test']}",
                f"trainer.run_dir={tmp_path / 'grpo'}",
                f"trainer.total_steps={GRPO_STEPS}",
                f"trainer.val_every={GRPO_STEPS}",
                "data.train_batch_size=16",
            ],
        ),
    )
    gain = held_out_gain(grpo)
    assert gain is not None and gain["n"] == 500
    print(gain_line(gain))
    assert gain["gain"] > 0 and gain["gain"] >= GAIN_Z * gain["gain_se"], gain_line(gain)
    rows = [json.loads(line) for line in (grpo / "metrics.jsonl").read_text().splitlines()]
    calls = [r["multi_turn/tool_calls/mean"] for r in rows if "multi_turn/tool_calls/mean" in r]
    print(f"tool calls per episode: {calls[0]:.2f} at the first step, {calls[-1]:.2f} at the last")
    assert calls[-1] >= 0.9 and rows[-1]["multi_turn/num_env_failed"] == 0
