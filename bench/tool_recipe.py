"""The tool task's learning recipe (testkit/tool_task.py, as tests/e2e/test_tool_learning.py runs it)
with its knobs as arguments and environment variables, in a temporary folder; prints the held-out greedy
gain, tool calls per episode and the training score by step, and the time of each part.

    .venv/bin/python bench/tool_recipe.py SFT_STEPS GRPO_STEPS [GRPO override ...]
    .venv/bin/python bench/tool_recipe.py 100 20 actor.lr=1e-4
    TOOL_SHARE=0.3 .venv/bin/python bench/tool_recipe.py 100 20   # a warm-up that calls the tool 30% of the time
    FORMAT=hermes WIDTH=128 TOOL_SHARE=0.5 SEED=1 .venv/bin/python bench/tool_recipe.py 300 20

FORMAT: text (the char-level model writing <calc>...</calc>; the default) or hermes (the model's own tool
format: a qwen2 with a BPE tokenizer and ChatML template). SEED seeds the model and the run; WIDTH=N a model
N wide (256 otherwise); TOOL_SHARE the share of calculator traces in the warm-up (1 otherwise);
TRACES_FIRST=N spends the warm-up's first N steps on traces only; SFT_LR the warm-up's learning rate
(configs/arithmetic_sft.yaml's 1e-3 otherwise) and SFT_SET="k=v ..." any other of its overrides.
"""

import os
import pathlib
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from orchestrator.output.report import gain_line, held_out_gain  # noqa: E402
from testkit.tool_task import Recipe, per_step, warm_up_and_train  # noqa: E402


def main():
    sft_steps, grpo_steps, extra = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    env = os.environ.get
    sft_overrides = [*([f"actor.lr={env('SFT_LR')}"] if env("SFT_LR") else []), *env("SFT_SET", "").split()]
    recipe = Recipe(
        fmt=env("FORMAT", "text"),
        seed=int(env("SEED", "0")),
        width=int(env("WIDTH", "256")),
        tool_share=float(env("TOOL_SHARE", "1")),
        sft_steps=sft_steps,
        traces_first=int(env("TRACES_FIRST", "0")),
        grpo_steps=grpo_steps,
        sft_overrides=tuple(sft_overrides),
        grpo_overrides=tuple(extra),
    )
    start = time.time()
    sft, grpo = warm_up_and_train(pathlib.Path(tempfile.mkdtemp()), recipe)
    warm = (sft / "metrics.jsonl").stat().st_mtime  # the warm-up's last step logged
    print(f"tool calls per episode by step: {[round(c, 2) for c in per_step(grpo, 'multi_turn/tool_calls/mean')]}")
    print(f"training score by step: {[round(c, 2) for c in per_step(grpo, 'critic/score/mean')]}")
    gain = held_out_gain(grpo)
    assert gain is not None  # validated at step 0 and at the last (val_every)
    took = f"SFT {warm - start:.0f} s, GRPO {time.time() - warm:.0f} s"
    print(f"{recipe}: {gain_line(gain)}; {took}; run in {grpo}", flush=True)


if __name__ == "__main__":
    main()
