"""Several optimizer steps per batch: what the old log-probs cost, a log-prob call before the update
against an update that finds its own (the first mini-batch from its own pass, the others from a pass
inside the update), on one fixed GRPO-shaped batch through a real actor service.

    .venv/bin/python bench/old_logprob_bench.py [--models tiny,50m] [--repeats 5] [--mini-batches 4]

The service runs as the main job's on CPU (one rank, the plain engine, prompts shared, a 4096-token
budget). Each repeat runs both ways on the same batch from the same weights (a checkpoint reloaded
between them), alternated; reports the median seconds of each way and of its parts.
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from meshrl.codec import Payload
from meshrl.codec.values import to_value
from meshrl.dataproto import DataProto
from meshrl.rpc import Client
from meshrl.tiny.models import TinyModelConfig, make_model
from meshrl.v1 import actor_pb2

SERVICE = actor_pb2.DESCRIPTOR.services_by_name["ActorService"]
MODELS = {  # name: (model, prompts, samples each, prompt tokens, most response tokens)
    "tiny": (TinyModelConfig(), 32, 8, 24, 8),  # the main job's shape
    "50m": (
        TinyModelConfig(hidden_size=640, num_layers=8, num_heads=10, num_kv_heads=5, intermediate_size=2560),
        8,
        8,
        32,
        64,
    ),
}


def grpo_batch(prompts: int, n: int, prompt: int, response: int) -> DataProto:
    """n samples of each prompt (the same prompt tokens), responses of varied length, right padded."""
    g = torch.Generator().manual_seed(0)
    rows = prompts * n
    p_ids = torch.randint(4, 100, (prompts, prompt), generator=g).repeat_interleave(n, 0)
    responses = torch.randint(4, 100, (rows, response), generator=g)
    lengths = torch.randint(1, response + 1, (rows,), generator=g)
    response_mask = (torch.arange(response)[None] < lengths[:, None]).float()
    mask = torch.cat([torch.ones(rows, prompt, dtype=torch.long), response_mask.long()], 1)
    return DataProto(
        {
            "input_ids": torch.cat([p_ids, responses * response_mask.long()], 1),
            "attention_mask": mask,
            "position_ids": (mask.cumsum(1) - 1).clamp(min=0),
            "responses": responses * response_mask.long(),
            "response_mask": response_mask,
            "advantages": torch.randn(rows, 1, generator=g).expand(rows, response) * response_mask,
        }
    )


def update(client: Client, step: int, data: DataProto, **params) -> float:
    t0 = time.perf_counter()
    loss = actor_pb2.LossSpec(name="ppo", params={k: to_value(v, k) for k, v in params.items()})
    client.call_message(
        "Update", Payload(actor_pb2.UpdateRequest(step=step, loss=loss), data), actor_pb2.UpdateResponse
    )
    return time.perf_counter() - t0


def logprobs(client: Client, data: DataProto) -> tuple[torch.Tensor, float]:
    t0 = time.perf_counter()
    reply = client.call("ComputeLogProbs", Payload(actor_pb2.BatchRequest(), data))
    assert isinstance(reply, Payload) and reply.data is not None  # the method's reply carries a batch
    return reply.data.batch["actor_logprobs"], time.perf_counter() - t0


def measure(name: str, repeats: int, mini_batches: int, tmp: Path) -> dict[str, list[float]]:
    cfg, prompts, n, p, r = MODELS[name]
    model = make_model(tmp / name, cfg)
    data = grpo_batch(prompts, n, p, r)
    schedule = {"mini_batch_size": len(data) // mini_batches, "temperature": 1.0}
    args = ["--role", "actor", "--model", str(model), "--world-size", "1", "--engine", "plain"]
    args += ["--micro-batch-tokens", "4096", "--lr", "1e-6", "--checkpoint-root", str(tmp)]
    proc = subprocess.Popen([sys.executable, "-m", "cli", "serve", "actor", *args], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None  # piped
    out: dict[str, list[float]] = {"call": [], "update after it": [], "both": [], "own": []}
    try:
        client = Client(proc.stdout.readline().split()[-1], SERVICE, timeout=600)
        ckpt = actor_pb2.CheckpointRequest(path=str(tmp / f"{name}-ckpt"))
        client.call_message("SaveCheckpoint", ckpt, actor_pb2.CheckpointResponse)
        step = 0
        for i in range(repeats + 1):  # the first is a warm-up
            client.call_message("LoadCheckpoint", ckpt, actor_pb2.CheckpointResponse)
            step += 1
            old, call = logprobs(client, data)
            after = update(client, step, DataProto(dict(data.batch, actor_logprobs=old)), **schedule)
            client.call_message("LoadCheckpoint", ckpt, actor_pb2.CheckpointResponse)
            step += 1
            own = update(client, step, data, old_logprobs_key="", **schedule)
            if i:
                for k, v in (("call", call), ("update after it", after), ("both", call + after), ("own", own)):
                    out[k].append(v)
    finally:
        proc.terminate()
        proc.wait()
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="tiny,50m")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--mini-batches", type=int, default=4)
    a = ap.parse_args()
    print(
        f"| model | batch | log-prob call | update after it | the two | update finding its own | own / the two |\n"
        f"|---|---|---|---|---|---|---|  ({a.mini_batches} mini-batches, median of {a.repeats})"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.models.split(","):
            m = {k: statistics.median(v) for k, v in measure(name, a.repeats, a.mini_batches, Path(tmp)).items()}
            _, prompts, n, p, r = MODELS[name]
            print(
                f"| {name} | {prompts} x {n} rows, {p} + up to {r} tokens | {m['call']:.3f} s "
                f"| {m['update after it']:.3f} s | {m['both']:.3f} s | {m['own']:.3f} s | {m['own'] / m['both']:.2f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
