"""A real OpenAI-compatible endpoint (meshrl/gateway) in front of a stand-in engine that answers every
call with the same text, and an agent that needs only the standard library (AGENT, written to a file by
write_agent), for playing agents without a model in an interpreter without meshrl:
tests/unit/test_agent_python.py and bench/agent_python_bench.py."""

import pathlib

from transformers import AutoTokenizer

from meshrl.gateway.server import Gateway
from meshrl.tiny.models import TinyModelConfig, make_model

ANSWER = "4<|im_end|>"
LOGPROB = -0.5  # every answered token's

AGENT = '''"""One chat call to the endpoint, its reply checked: the standard library only (the `openai`
package where it is installed), so that an interpreter without meshrl runs it.

    rollout.agent=agent.py:agent                     # a worker plays many episodes
    rollout.agent_command="python agent.py"          # a process per episode (the task on stdin)

The task steers what goes wrong: {"fail": "raise"} raises, {"fail": "exit"} ends the process. The result
says who played it: the process (pid), whether meshrl was importable there, the client it used.
"""

import importlib.util
import json
import os
import sys
import urllib.request

try:
    import openai
except ImportError:  # an interpreter without it: plain HTTP
    openai = None


def ask(messages, base_url, api_key):
    if openai is not None:
        client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        return client.chat.completions.create(model="policy", messages=messages).choices[0].message.content
    body = json.dumps({"model": "policy", "messages": messages}).encode()
    headers = {"Authorization": "Bearer " + api_key, "Content-Type": "application/json"}
    request = urllib.request.Request(base_url + "/chat/completions", body, headers)
    with urllib.request.urlopen(request, timeout=60) as reply:
        return json.load(reply)["choices"][0]["message"]["content"]


def agent(task, base_url, api_key):
    if task.get("fail") == "raise":
        raise RuntimeError("this episode's tool is down")
    if task.get("fail") == "exit":
        os._exit(3)
    text = ask(task["prompt"], base_url, api_key)
    return {
        "reward": float(text.strip() == "4"),
        "pid": os.getpid(),
        "meshrl": importlib.util.find_spec("meshrl") is not None,
        "client": "urllib" if openai is None else "openai",
    }


if __name__ == "__main__":
    result = agent(json.load(sys.stdin), os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"])
    print(json.dumps(result))
'''


class Answers:
    """The gateway's engine: every call is answered with ANSWER (weight version 7)."""

    def __init__(self, tokenizer):
        self.tokens = tokenizer(ANSWER, add_special_tokens=False)["input_ids"]
        self.calls = 0

    def generate(self, session, ids, n, max_new, request):
        self.calls += 1
        tokens = self.tokens[:max_new]
        return [(tokens, [LOGPROB] * len(tokens), None, 7)] * n


def endpoint(folder: pathlib.Path) -> Gateway:
    """A started gateway on 127.0.0.1 with a tiny qwen2 model's tokenizer (written in `folder`)."""
    small = TinyModelConfig(
        family="qwen2", tokenizer="bpe", hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1
    )
    tok = AutoTokenizer.from_pretrained(make_model(folder, small))
    ends = frozenset([tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")])
    return Gateway(Answers(tok), tok, "policy", ends).start()


def write_agent(folder: pathlib.Path) -> pathlib.Path:
    path = folder / "agent.py"
    path.write_text(AGENT)
    return path
