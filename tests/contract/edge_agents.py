"""Agents for tests/contract/test_multi_turn_tools.py that meet the model's limits: by the task's question,
one asks with a prompt that leaves 3 tokens of room in the context, one with a token id outside the
vocabulary, and the rest play the bundled calculator agent (examples/agents/calculator.py). Each scores
what the endpoint answered, so the test can see that one episode's refusal stays its own."""

import importlib.util
import pathlib

import openai

_path = pathlib.Path(__file__).resolve().parents[2] / "examples/agents/calculator.py"
_spec = importlib.util.spec_from_file_location("meshrl_example_calculator", _path)
assert _spec is not None and _spec.loader is not None
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
calculator = _module.agent

ROOM = 3  # tokens left in the context by the long prompt


def agent(task: dict, base_url: str, api_key: str) -> dict:
    question = task["prompt"][-1]["content"]
    if question not in ("long", "oov"):
        return calculator(task, base_url, api_key)
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    limit, vocab = task["extra_info"]["max_model_len"], task["extra_info"]["vocab_size"]
    prompt = [5] * (limit - ROOM) if question == "long" else [5, vocab + 5]
    try:
        reply = client.completions.create(model="policy", prompt=prompt, max_tokens=64)
    except openai.APIStatusError as e:  # 0.25: refused as the caller's mistake, naming the prompt
        return {"reward": 0.25 if e.status_code == 400 and (e.body or {}).get("param") == "prompt" else -1.0}
    return {"reward": 0.5 if reply.usage.completion_tokens == ROOM else -1.0}  # 0.5: answered in the room left
