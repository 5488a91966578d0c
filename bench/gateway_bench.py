"""What the OpenAI-compatible endpoint costs (issue 44), on this machine.

    .venv/bin/python bench/gateway_bench.py [CALLS] [EPISODES]

1. Latency: CALLS chat calls through the endpoint (`meshrl serve gateway`'s engine, in this process, the
   `openai` client) against the same prompt's Generate sent straight to the same rollout service (hf
   backend, the Qwen2.5-shaped tiny model, 8 new tokens, one at a time): median and p99 of each, and the
   endpoint's added time.
2. The endpoint's own time: the same chat CALLS times with an engine that answers at once, through the
   `openai` client, as one HTTP request by hand, and as Gateway.complete called directly.
3. Episodes per second: EPISODES calculator episodes (two turns each: a tool call, then the answer) played
   at once by the OpenAI-SDK agent (rollout.agent, examples/agents/calculator.py) against the same tasks
   played through the environment service (rollout.multi_turn, rollout.tool_parser=hermes), over one
   rollout service whose engine writes each turn from a script (tests/contract/test_multi_turn_tools.py),
   so that what is measured is each path's own work, not the model's. The agent's workers are started by
   a first round that is not timed.
"""

import dataclasses
import http.client
import json
import pathlib
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np
import openai
import torch
from transformers import AutoTokenizer

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from meshrl.codec.payload import Payload  # noqa: E402
from meshrl.config.env import EnvConfig  # noqa: E402
from meshrl.config.rollout import RolloutConfig  # noqa: E402
from meshrl.dataproto import DataProto  # noqa: E402
from meshrl.gateway.server import Gateway  # noqa: E402
from meshrl.gateway.sessions import Session  # noqa: E402
from meshrl.rpc import Client, Server  # noqa: E402
from meshrl.tiny.arithmetic import CALCULATOR, ArithmeticConfig, make_data  # noqa: E402
from meshrl.tiny.models import TinyModelConfig, make_model  # noqa: E402
from meshrl.v1 import rollout_pb2  # noqa: E402
from orchestrator.agents import episode  # noqa: E402
from orchestrator.config import load_config  # noqa: E402
from orchestrator.lifecycle.mesh import Mesh  # noqa: E402
from orchestrator.sampling import agents, multi_turn  # noqa: E402
from services.env.servicer import EnvServicer  # noqa: E402
from services.gateway.engine import RolloutEngine  # noqa: E402
from services.rollout.servicer import RolloutServicer  # noqa: E402
from testkit.scripted import SETTINGS, ScriptedEngine, batch  # noqa: E402


def quantiles(xs: list[float]) -> str:
    ms = sorted(x * 1000 for x in xs)
    return f"median {statistics.median(ms):.2f} ms, p99 {ms[int(0.99 * (len(ms) - 1))]:.2f} ms"


def latency(model: pathlib.Path, calls: int) -> None:
    servicer = RolloutServicer(RolloutConfig(model=str(model), backend="hf", max_model_len=512))
    server = Server([servicer]).start()
    tok = AutoTokenizer.from_pretrained(model)
    messages: list[Any] = [{"role": "user", "content": "12*7="}]
    ids = tok(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))["input_ids"]
    client = Client(server.address, RolloutServicer.SERVICE)
    prompt = DataProto({"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)})
    sampling = rollout_pb2.SamplingParams(n=1, temperature=1.0, top_p=1.0, top_k=-1, max_new_tokens=8, logprobs=True)
    engine = RolloutEngine([server.address])
    ends = frozenset([tok.eos_token_id])
    gateway = Gateway(engine, tok, "policy", ends, tool_parser="hermes").start()
    session = gateway.open(Session(keep=4))
    chat = openai.OpenAI(base_url=gateway.base_url, api_key=session.key, max_retries=0)
    direct, through = [], []
    for i in range(calls + 10):  # the first 10 of each warm up
        sampling.seed = i
        t = time.perf_counter()
        client.call_batch(
            "Generate", Payload(rollout_pb2.GenerateRequest(sampling=sampling), prompt), rollout_pb2.GenerateResponse
        )
        d = time.perf_counter() - t
        t = time.perf_counter()
        chat.chat.completions.create(model="policy", messages=messages, max_tokens=8, seed=i)
        g = time.perf_counter() - t
        if i >= 10:
            direct.append(d)
            through.append(g)
    added = [g - d for g, d in zip(through, direct)]
    print(f"latency, {calls} calls of 8 new tokens, hf backend:")
    print(f"  Generate straight to the rollout: {quantiles(direct)}")
    print(f"  through the endpoint:             {quantiles(through)}")
    print(f"  added by the endpoint (paired):   median {statistics.median(added) * 1000:.2f} ms")
    gateway.stop()
    engine.close()
    client.close()
    server.stop(0)
    servicer.close()


class Instant:
    """An engine that answers every call at once with the same turn."""

    def __init__(self, tok):
        self.tokens = tok("84<|im_end|>", add_special_tokens=False)["input_ids"]

    def generate(self, session, ids, n, max_new, request):
        return [(self.tokens, [-0.5] * len(self.tokens), "84", 1)] * n


def overhead(model: pathlib.Path, calls: int) -> None:
    tok = AutoTokenizer.from_pretrained(model)
    gateway = Gateway(Instant(tok), tok, "policy", frozenset([tok.eos_token_id]), tool_parser="hermes").start()
    session = gateway.open(Session(keep=4))
    body: dict[str, Any] = {"model": "policy", "messages": [{"role": "user", "content": "12*7="}], "max_tokens": 8}
    chat = openai.OpenAI(base_url=gateway.base_url, api_key=session.key, max_retries=0)
    conn = http.client.HTTPConnection("127.0.0.1", gateway.http.server_address[1])
    headers = {"Authorization": f"Bearer {session.key}", "Content-Type": "application/json"}

    def by_hand():
        conn.request("POST", "/v1/chat/completions", json.dumps(body).encode(), headers)
        conn.getresponse().read()

    ways = {
        "through the openai client": lambda: chat.chat.completions.create(**body),
        "one HTTP request by hand": by_hand,
        "Gateway.complete, no HTTP": lambda: gateway.complete(session, body, True),
    }
    print(f"the endpoint's own time, {calls} calls answered at once:")
    for name, call in ways.items():
        times = []
        for i in range(calls + 10):
            t = time.perf_counter()
            call()
            if i >= 10:
                times.append(time.perf_counter() - t)
        print(f"  {name}: {quantiles(times)}")
    gateway.stop()


def episodes_per_second(tmp: pathlib.Path, episodes: int) -> None:
    small = TinyModelConfig(family="qwen2", tokenizer="bpe", hidden_size=32, intermediate_size=64, num_layers=1)
    model = make_model(tmp / "bpe", dataclasses.replace(small, num_heads=2, num_kv_heads=1))
    files = make_data(tmp / "data", ArithmeticConfig(num_train=8, num_test=1))
    tok = AutoTokenizer.from_pretrained(model)
    rollout = RolloutServicer(RolloutConfig(model=str(model), max_model_len=512), ScriptedEngine(tok))
    env = EnvServicer(EnvConfig(module="services.env.calculator:Calculator", processes=2))
    servers = [Server([rollout]).start(), Server([env]).start()]
    base = [f"data.train_files={files['train']}", f"actor.model={model}", *SETTINGS, "rollout.concurrency=256"]
    rollout_client = Client(servers[0].address, RolloutServicer.SERVICE, timeout=600)
    env_mesh = Mesh(
        load_config(None, [*base, "rollout.multi_turn=true"]),
        {"rollout": rollout_client, "env": Client(servers[1].address, EnvServicer.SERVICE, timeout=600)},
    )
    spec = f"{ROOT / 'examples/agents/calculator.py'}:agent"
    agent_mesh = Mesh(
        load_config(None, [*base, f"rollout.agent={spec}", "rollout.agent_workers=2"]), {"rollout": rollout_client}
    )
    questions = ["12*7=", "5*5=", "2*6="] * (episodes // 3 + 1)
    truths = {"12*7=": "84", "5*5=": "25", "2*6=": "12"}
    data = batch(questions[:episodes], [truths[q] for q in questions[:episodes]])
    data.batch["attention_mask"] = data.batch["input_ids"]
    data.non_tensor_batch["tools"] = np.array([f"[{json.dumps(CALCULATOR)}]"] * episodes, dtype=object)
    agents.sample(agent_mesh, data, seed=0, tokenizer=tok)  # the workers start (untimed)
    rates = {}
    for name, mesh, sample in [
        ("environment service", env_mesh, multi_turn.sample),
        ("OpenAI agent", agent_mesh, agents.sample),
    ]:
        times = []
        for round in range(3):
            t = time.perf_counter()
            _, scored, _ = sample(mesh, data, seed=round + 1, tokenizer=tok)
            times.append(time.perf_counter() - t)
            assert float(scored.scores.mean()) == 1.0
        rates[name] = episodes / statistics.median(times)
        print(f"  {name}: {rates[name]:.0f} episodes/s (median of 3 rounds of {episodes} at once)")
    print(f"  agent / environment: {rates['OpenAI agent'] / rates['environment service']:.2f}x")
    episode.close_runners()
    for s in servers:
        s.stop(0)
    rollout.close()
    env.close()


def main() -> None:
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    episodes = int(sys.argv[2]) if len(sys.argv) > 2 else 256
    tmp = pathlib.Path(tempfile.mkdtemp())
    model = make_model(tmp / "lm", TinyModelConfig(family="qwen2", tokenizer="bpe"))
    latency(model, calls)
    overhead(model, calls)
    print(f"episodes per second, {episodes} two-turn calculator episodes at once, scripted engine:")
    episodes_per_second(tmp, episodes)


if __name__ == "__main__":
    main()
