"""The tool claim in the model's own tool format (issue 31), end to end, with the episodes played by an
agent written against the OpenAI API (issue 44): a qwen2 with a byte-level BPE tokenizer and ChatML
template built here, SFT on `messages` conversations (calls as <tool_call> JSON, results in the tool
role, loss on the assistant turns alone), then GRPO whose episodes the calculator agent
(examples/agents/calculator.py, rollout.agent) plays with the `openai` client against the run's
endpoint: `tools=[calculator]`, listed by the template in the system turn; calls parsed with
rollout.tool_parser=hermes and returned as `tool_calls`; results sent back in the tool role; turns
ending at the model's end tokens. Held-out greedy accuracy (500 problems, played by the agent too) must
rise by GAIN_Z paired standard errors and tool calls per episode by MORE_CALLS (testkit/tool_task.py).

The agent's recording is, token for token, what the environment service's path plays for the same task
(tests/contract/test_multi_turn_tools.py), so this test stands for both paths; the text format's test
(test_tool_learning.py) runs the environment service.

The model is 128 wide (0.8M parameters): every sequence carries the ~85-token system turn, and at the
default width (256) the warm-up took 457-669 s here and left one seed of three unable to use the tool.
At 128 wide, 300 warm-up steps then 20 GRPO steps through the environment service, from
`FORMAT=hermes WIDTH=128 TOOL_SHARE=0.5 SEED=N .venv/bin/python bench/tool_recipe.py 300 20` (bench/RESULTS.md):
seed 0 0.638 -> 0.788 (+15.0 points, 7.4 s.e.), seed 1 0.858 -> 0.988 (+13.0, 8.6 s.e.), seed 2
0.632 -> 0.748 (+11.6, 6.8 s.e.), seed 3 0.968 -> 0.988 (+2.0, 3.2 s.e.). Through the agent, seed 0: the
same command with `rollout.multi_turn=false rollout.agent=$PWD/examples/agents/calculator.py:agent` gave
0.486 -> 0.800 (+31.4, 14.1 s.e.); as this test runs it, pinned to one core on a pytest-xdist worker,
300 warm-up steps and 20 GRPO steps gave 0.686 -> 0.782 in 447 s, 200 and 20 gave 0.414 -> 0.584 (+17.0
± 1.9, 8.9 s.e.; tool calls per episode 0.41 -> 0.74) in 395 s, and the 200 and 16 it now takes (to keep
the suite within its time) 0.414 -> 0.510 (+9.6 ± 2.0, 4.8 s.e.; tool calls 0.28 -> 0.69) in 367 s. Another
machine's numerics land the warm-up elsewhere, so the bar is the text format's 2 s.e."""

import json

import pytest

from testkit.tool_task import Recipe, agent_workers_left, check_agent_steps, check_learned, warm_up_and_train

GAIN_Z = 2.0  # 3.2-8.6 standard errors over four seeds here; multi-turn runs are not bit-reproducible
RECIPE = Recipe(fmt="hermes", width=128, sft_steps=200, tool_share=0.5, grpo_steps=16, agent=True)


@pytest.mark.slow
@pytest.mark.timeout(1200)  # ~400 s on one core here; a slower machine must not cut it at the suite's 600
def test_grpo_teaches_an_openai_agent_to_call_the_calculator_in_its_models_template(tmp_path):
    _, grpo = warm_up_and_train(tmp_path, RECIPE)
    check_learned(grpo, GAIN_Z)
    # the episodes are in the template's format: a Hermes call, then its result in the tool role's tags
    samples = [json.loads(line) for line in (grpo / "samples.jsonl").read_text().splitlines()]
    # (a call the parser cannot read is no call: the endpoint returns its text as the reply's content, as
    # vLLM's server does, and the agent takes it for the answer, so only closed calls are asked about)
    right_with_the_tool = [s for s in samples if s["acc"] and '<tool_call>\n{"name": "calculator"' in s["response"]]
    closed = [s for s in right_with_the_tool if "</tool_call>" in s["response"]]
    assert closed and all("<tool_response>\n" in s["response"] for s in closed)
    # every episode was played and recorded, and the rollout's log-probs of what was recorded are the
    # actor's at the parity level of every other path (test_agent_run.py's bar), step after step
    check_agent_steps(grpo, steps=RECIPE.grpo_steps)
    assert not agent_workers_left()  # the run's way out stopped its agent workers
