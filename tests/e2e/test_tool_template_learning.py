"""The tool claim in the model's own tool format (issue 31), end to end: a qwen2 with a byte-level BPE
tokenizer and ChatML template built here, the calculator's schema listed in the system turn by the
template, SFT on `messages` conversations (calls as <tool_call> JSON, results in the tool role, loss on
the assistant turns alone), then multi-turn GRPO whose turns end at the model's end tokens, whose calls
are parsed by rollout.tool_parser=hermes and whose results come back through the template's tool role.
Held-out greedy accuracy must rise by GAIN_Z paired standard errors and tool calls per episode by
MORE_CALLS (tests/e2e/tool_task.py), as in the text format.

The model is 128 wide (0.8M parameters): every sequence carries the ~85-token system turn, and at the
default width (256) the warm-up took 457-669 s here and left one seed of three unable to use the tool
(held-out 0.066 after SFT). At 128 wide, 300 warm-up steps then 20 GRPO steps, from
`FORMAT=hermes WIDTH=128 TOOL_SHARE=0.5 SEED=N .venv/bin/python bench/tool_recipe.py 300 20` (bench/RESULTS.md):
seed 0 0.638 -> 0.788 (+15.0 points, 7.4 s.e.), seed 1 0.858 -> 0.988 (+13.0, 8.6 s.e.), seed 2
0.632 -> 0.748 (+11.6, 6.8 s.e.), seed 3 0.968 -> 0.988 (+2.0, 3.2 s.e.: a warm-up that ends near the
ceiling leaves little to gain), each in about 5.5 minutes on one core. The test runs seed 0; another
machine's numerics land the warm-up elsewhere, so the bar is the text format's 2 s.e., and tool calls
per episode rose by 0.30-0.50 (the last three steps against the first) on every seed."""

import json

import pytest
from tool_task import Recipe, check_learned, warm_up_and_train

GAIN_Z = 2.0  # 3.2-8.6 standard errors over four seeds here; multi-turn runs are not bit-reproducible
RECIPE = Recipe(fmt="hermes", width=128, sft_steps=300, tool_share=0.5, grpo_steps=20)


@pytest.mark.slow
@pytest.mark.timeout(1200)  # ~330 s on one core here; a slower machine must not cut it at the suite's 600
def test_grpo_teaches_a_bpe_model_to_call_the_calculator_in_its_own_template(tmp_path):
    _, grpo = warm_up_and_train(tmp_path, RECIPE)
    check_learned(grpo, GAIN_Z)
    # the episodes are in the template's format: a Hermes call, then its result in the tool role's tags
    samples = [json.loads(line) for line in (grpo / "samples.jsonl").read_text().splitlines()]
    right_with_the_tool = [s for s in samples if s["acc"] and '<tool_call>\n{"name": "calculator"' in s["response"]]
    assert right_with_the_tool and all("<tool_response>\n" in s["response"] for s in right_with_the_tool)
