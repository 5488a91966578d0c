"""Actor benchmark: one PPO update of a fixed batch through the service vs the same step in process.

Both run 2 ranks of the fsdp2 engine on gloo, with the same handler code
(services.actor.handler); the service adds gRPC, checks, sharding and the
command/scatter/gather traffic between ranks. Also reports step time and peak
memory (RSS high-water mark) per rank, for the tiny model and a ~50M one.

    .venv/bin/python bench/actor_bench.py [--repeats 5] [--models tiny,50m]
"""

import argparse
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from meshrl.codec import Payload
from meshrl.dataproto import DataProto
from meshrl.rpc import Client
from meshrl.tiny.models import TinyModelConfig, make_model
from meshrl.v1 import actor_pb2

SERVICE = actor_pb2.DESCRIPTOR.services_by_name["ActorService"]
MODELS = {  # name: (model config, rows, prompt length, response length)
    "tiny": (TinyModelConfig(), 16, 32, 64),
    "50m": (
        TinyModelConfig(hidden_size=640, num_layers=8, num_heads=10, num_kv_heads=5, intermediate_size=2560),
        8,
        32,
        64,
    ),
}
ENGINE = {"engine": "fsdp2", "micro_batch_size": 4}
OPTIM = {"lr": 1e-6}


def ppo_batch(rows: int, prompt: int, response: int) -> DataProto:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, 100, (rows, prompt + response), generator=g)
    mask = torch.ones_like(ids)
    return DataProto(
        {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": (mask.cumsum(1) - 1),
            "responses": ids[:, prompt:],
            "response_mask": torch.ones(rows, response),
            "advantages": torch.randn(rows, response, generator=g),
            "actor_logprobs": -torch.rand(rows, response, generator=g),
        }
    )


def peak_rss_mib(pid: int) -> float:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def rank_job(model: str, name: str, repeats: int, out: str) -> None:
    """One rank of the in-process run: the handler's update, timed on rank 0."""
    import torch.distributed as dist

    from services.actor import batches
    from services.actor.handler import RankHandler
    from services.actor.launch import join_group

    join_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    _, rows, p, r = MODELS[name]
    handler = RankHandler("actor")
    handler.init({"model": model, "engine": ENGINE, "optim": OPTIM})
    parts, _ = batches.shard(ppo_batch(rows, p, r), world)
    args = {"loss": "ppo", "params": {}, "total_rows": rows, "step": 1}
    times = []
    for i in range(repeats + 1):  # the first is a warm-up
        dist.barrier()
        t0 = time.perf_counter()
        handler.update(args, parts[rank])
        dist.barrier()
        if i:
            times.append(time.perf_counter() - t0)
    peak = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024], dtype=torch.float64)
    peaks = [torch.zeros(1, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(peaks, peak)
    if rank == 0:
        pathlib.Path(out).write_text(
            json.dumps({"step_s": statistics.median(times), "peak_mib": [p.item() for p in peaks]})
        )
    dist.destroy_process_group()


def in_process(model: str, name: str, repeats: int) -> dict:
    from services.actor.launch import new_store, rank_env

    out = tempfile.mktemp(suffix=".json")
    store = new_store()
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--rank-job", model, name, str(repeats), out],
            env={**os.environ, **rank_env(r, 2, store)},
        )
        for r in range(2)
    ]
    for p in procs:
        assert p.wait() == 0
    return json.loads(pathlib.Path(out).read_text())


def through_service(model: str, name: str, repeats: int) -> dict:
    _, rows, p, r = MODELS[name]
    args = [
        "--role",
        "actor",
        "--model",
        model,
        "--world-size",
        "2",
        "--engine",
        "fsdp2",
        "--micro-batch-size",
        str(ENGINE["micro_batch_size"]),
        "--lr",
        str(OPTIM["lr"]),
    ]
    proc = subprocess.Popen([sys.executable, "-m", "cli", "serve", "actor", *args], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None  # piped
    try:
        client = Client(proc.stdout.readline().split()[-1], SERVICE, timeout=600)
        data = ppo_batch(rows, p, r)
        times, inside = [], []
        for step in range(1, repeats + 2):
            t0 = time.perf_counter()
            request = Payload(actor_pb2.UpdateRequest(step=step, loss=actor_pb2.LossSpec(name="ppo")), data)
            reply = client.call_message("Update", request, actor_pb2.UpdateResponse)
            if step > 1:
                times.append(time.perf_counter() - t0)
                inside.append(reply.metrics["actor/update_seconds"])
        children = pathlib.Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        peaks = [peak_rss_mib(proc.pid)] + [peak_rss_mib(int(c)) for c in children]
    finally:
        proc.terminate()
        proc.wait()
    overhead = statistics.median([(t - i) / t for t, i in zip(times, inside)])
    return {"step_s": statistics.median(times), "peak_mib": peaks, "overhead": overhead}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--models", default="tiny,50m")
    ap.add_argument("--rank-job", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_job:
        model, name, repeats, out = args.rank_job
        return rank_job(model, name, int(repeats), out)
    tmp = pathlib.Path(tempfile.mkdtemp())
    print(
        "| model | params | batch (rows x tokens) | in-process step | service step | service / in-process "
        "| service overhead within its calls | peak RSS per rank, in process | peak RSS per rank, service |\n"
        "|---|---|---|---|---|---|---|---|---|"
    )
    for name in args.models.split(","):
        cfg, rows, p, r = MODELS[name]
        path = make_model(tmp / name, cfg)
        n = sum(
            t.numel()
            for t in __import__("safetensors.torch", fromlist=["x"]).load_file(path / "model.safetensors").values()
        )
        local = in_process(str(path), name, args.repeats)
        served = through_service(str(path), name, args.repeats)
        ratio = served["step_s"] / local["step_s"]
        fmt = lambda peaks: " / ".join(f"{x:,.0f} MiB" for x in peaks)  # noqa: E731
        print(
            f"| {name} | {n / 1e6:.1f}M | {rows} x {p + r} | {local['step_s'] * 1e3:,.0f} ms | "
            f"{served['step_s'] * 1e3:,.0f} ms | {ratio:.2f} | {served['overhead']:.1%} | "
            f"{fmt(local['peak_mib'])} | {fmt(served['peak_mib'])} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
