"""The tool task's learning recipe (tests/e2e/test_tool_learning.py) with its knobs as arguments: a fresh
tiny model, SFT on calculator traces for SFT_STEPS, then GRPO_STEPS of multi-turn GRPO with the calculator
(configs/calculator_grpo.yaml, batch 16) and the held-out greedy gain, in a temporary folder.

    .venv/bin/python bench/tool_recipe.py SFT_STEPS GRPO_STEPS [override ...]
    .venv/bin/python bench/tool_recipe.py 100 20 actor.lr=1e-4
    TOOL_SHARE=0.3 .venv/bin/python bench/tool_recipe.py 100 20   # a warm-up that calls the tool 30% of the time
    FORMAT=hermes TOOL_SHARE=0.5 SEED=1 .venv/bin/python bench/tool_recipe.py 100 20

FORMAT=hermes: the model's own tool format, as a Qwen2.5 model would be trained: a Qwen2 with a byte-level
BPE tokenizer and ChatML template (meshrl/tiny/bpe.py), SFT on the `messages` conversations (the tool
listed in the system turn, <tool_call> JSON, results in the tool role), GRPO with rollout.tool_parser=hermes.
FORMAT=text (the default): the char-level model writing <calc>...</calc>. SEED seeds the model and the run.
SFT_LR sets the warm-up's learning rate (configs/arithmetic_sft.yaml's 1e-3 otherwise), SFT_SET="k=v ..." any
other of its overrides; WIDTH=N a model N wide (256 otherwise). TRACES_FIRST=N spends
the warm-up's first N steps on calculator traces only, then the rest on the TOOL_SHARE mix.
"""

import dataclasses
import json
import os
import pathlib
import sys
import tempfile
import time

from meshrl.tiny.arithmetic import ArithmeticConfig, make_data
from meshrl.tiny.models import TinyModelConfig, make_model
from orchestrator.config import load_config
from orchestrator.main import run
from orchestrator.output.report import gain_line, held_out_gain

ROOT = pathlib.Path(__file__).resolve().parents[1]


def main():
    sft_steps, grpo_steps, extra = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    tmp = pathlib.Path(tempfile.mkdtemp())
    start = time.time()
    fmt, seed = os.environ.get("FORMAT", "text"), int(os.environ.get("SEED", "0"))
    hermes = fmt == "hermes"
    config = TinyModelConfig(seed=seed, family="qwen2" if hermes else "llama", tokenizer="bpe" if hermes else "char")
    width = int(os.environ.get("WIDTH", config.hidden_size))  # WIDTH=N: a model N wide, its MLP as much wider
    config = dataclasses.replace(config, hidden_size=width, intermediate_size=config.intermediate_size * width // 256)
    model = make_model(tmp / "model", config)
    share = float(os.environ.get("TOOL_SHARE", "1"))
    task = ArithmeticConfig(ops="*", max_operand=99, tool=True, tool_share=share, tool_format=fmt)
    data = make_data(tmp / "data", task)
    common = ["actor.engine=plain", "actor.world_size=1", "trainer.trace=", f"trainer.seed={seed}"]
    sft_format = ["data.prompt_key=messages"] if hermes else []
    grpo_format = ["rollout.tool_parser=hermes", "rollout.max_new_tokens=32"] if hermes else []
    # TRACES_FIRST=N: the warm-up's first N steps on calculator traces only (the copying of operands and
    # results is all there is to learn there), the rest on the TOOL_SHARE mix
    first = int(os.environ.get("TRACES_FIRST", "0"))
    phases = [(first, 1.0), (sft_steps - first, share)] if first else [(sft_steps, share)]
    warmed = model
    for i, (steps, tool_share) in enumerate(phases):
        files = (
            data
            if tool_share == share
            else make_data(tmp / f"data{i}", dataclasses.replace(task, tool_share=tool_share))
        )
        warmed = (
            run(
                "sft",
                load_config(
                    str(ROOT / "configs/arithmetic_sft.yaml"),
                    [
                        *common,
                        f"actor.model={warmed}",
                        f"data.train_files={files['train']}",
                        f"trainer.run_dir={tmp / f'sft{i}'}",
                        f"trainer.total_steps={steps}",
                        *sft_format,
                        *([f"actor.lr={os.environ['SFT_LR']}"] if os.environ.get("SFT_LR") else []),
                        *(os.environ.get("SFT_SET", "").split()),
                    ],
                ),
            )
            / "hf"
        )
    sft = warmed.parent
    warm = time.time()
    grpo = run(
        "grpo",
        load_config(
            str(ROOT / "configs/calculator_grpo.yaml"),
            [
                *common,
                f"actor.model={sft / 'hf'}",
                f"data.train_files={data['train']}",
                f"data.val_files={data['test']}",
                f"trainer.run_dir={tmp / 'grpo'}",
                f"trainer.total_steps={grpo_steps}",
                f"trainer.val_every={grpo_steps}",
                "data.train_batch_size=16",
                *grpo_format,
                *extra,
            ],
        ),
    )
    rows = [json.loads(line) for line in (grpo / "metrics.jsonl").read_text().splitlines()]
    calls = [r["multi_turn/tool_calls/mean"] for r in rows if "multi_turn/tool_calls/mean" in r]
    scores = [r["critic/score/mean"] for r in rows if "critic/score/mean" in r]
    print(f"tool calls per episode by step: {[round(c, 2) for c in calls]}")
    print(f"training score by step: {[round(c, 2) for c in scores]}")
    gain = held_out_gain(grpo)
    assert gain is not None  # validated at step 0 and at the last (val_every)
    print(
        f"{fmt}, seed {seed}, SFT {sft_steps} steps, GRPO {grpo_steps} steps {extra}: {gain_line(gain)}; "
        f"SFT {warm - start:.0f} s, GRPO {time.time() - warm:.0f} s; run in {grpo}",
        flush=True,
    )


if __name__ == "__main__":
    main()
