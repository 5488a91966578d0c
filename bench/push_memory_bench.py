"""Peak host memory of a weight push, by bucket size: the actor service (2 ranks, fsdp2 unless
--engine says fsdp1) pushing a ~370 MiB model over shm into a rollout service (HF backend).

For each bucket size the actor's ranks and the rollout have their peak RSS reset
(/proc/PID/clear_refs 5) before the push; the figure is how far the peak rose over
what the process held before (its shard and optimizer state, or the model), so it
is what the push itself needed, shared-memory pages it touched included. One push
before the rows warms both sides up (the rollout's first load makes its
memory-mapped weights resident). The rollout's staging segment is read from
/dev/shm. "whole" is one bucket holding the whole model, as every push was
before buckets; a bucket smaller than a transformer block holds one block.

The services run with glibc's mmap threshold fixed at 1 MiB (MALLOC_MMAP_THRESHOLD_): by default it
rises after the first large free, later large buffers come from the heap and stay resident after they
are freed, and a row would then measure what earlier rows left behind, not what its push needs.

    .venv/bin/python bench/push_memory_bench.py [--layers 8] [--hidden 1024] [--repeats 3] [--engine fsdp1]
"""

import argparse
import os
import pathlib
import statistics
import subprocess
import tempfile
import time

import torch
from safetensors import safe_open

from meshrl import weights
from meshrl.rpc import Client
from meshrl.tiny.models import TinyModelConfig, make_model
from meshrl.v1 import actor_pb2, rollout_pb2
from orchestrator.lifecycle.services import launch

ROLLOUT = rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"]
ACTOR = actor_pb2.DESCRIPTOR.services_by_name["ActorService"]
MiB = 1 << 20


def family(pid: int) -> list[int]:
    """The process and its descendants (the actor's other ranks)."""
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [pid] + [p for c in out for p in family(int(c))]


def status(pid: int, key: str) -> int:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def reset_peak(pids: list[int]) -> dict[int, int]:
    for p in pids:
        pathlib.Path(f"/proc/{p}/clear_refs").write_text("5")
    return {p: status(p, "VmRSS") for p in pids}


def rise(before: dict[int, int]) -> int:
    """The largest rise of a process's peak RSS over what it held before."""
    return max(status(p, "VmHWM") - rss for p, rss in before.items())


def sized_model(folder: pathlib.Path, layers: int, hidden: int) -> tuple[pathlib.Path, int]:
    """A fresh Llama of that size (8 heads, Llama's MLP ratio) and its bytes of safetensors."""
    model = make_model(
        folder,
        TinyModelConfig(hidden_size=hidden, num_layers=layers, num_heads=8, intermediate_size=int(hidden * 2.6875)),
    )
    return model, sum(f.stat().st_size for f in model.glob("*.safetensors"))


def segment_bytes(pid: int) -> int:
    return sum(f.stat().st_size for f in pathlib.Path("/dev/shm").glob(f"meshrl-rollout-{pid}-*"))


def main():  # limit: one benchmark's script, read top to bottom
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--engine", default="fsdp2", choices=["fsdp2", "fsdp1"])
    args = ap.parse_args()
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(MiB))  # the services inherit it (see above)
    tmp = pathlib.Path(tempfile.mkdtemp())
    model, size = sized_model(tmp / "lm", args.layers, args.hidden)
    rollout_proc, rollout_address = launch(
        ["rollout", "--model", str(model), "--backend", "hf", "--max-model-len", "64"]
    )
    actor_proc, actor_address = launch(
        [
            "actor",
            "--role",
            "actor",
            "--model",
            str(model),
            "--world-size",
            "2",
            "--lr",
            "1e-4",
            "--checkpoint-root",
            str(tmp),
            "--engine",
            args.engine,
        ]
    )
    actor = Client(actor_address, ACTOR, timeout=600)
    ranks = family(actor_proc.pid)
    print(
        f"model: {size / MiB:,.0f} MiB of safetensors; {args.engine} actor ranks {ranks}, rollout {rollout_proc.pid}\n"
    )
    print("| bucket | buckets | push s (median) | actor rank peak rise | rollout peak rise | staging segment |")
    print("|---|---|---|---|---|---|")
    with safe_open(str(model / "model.safetensors"), framework="pt") as st:
        specs = [(k, st.get_slice(k).get_dtype(), st.get_slice(k).get_shape()) for k in st.keys()]
    dtypes = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
    specs = [(k, dtypes[d], s) for k, d, s in specs]
    version = 1
    try:
        actor.call(
            "PushWeights",
            actor_pb2.PushWeightsRequest(
                rollout_address=rollout_address, transport="shm", version=version, bucket_bytes=16 * MiB
            ),
        )  # warm-up
        # smallest first: the rollout's segment only grows, so each row reads its own
        for bucket_mb in (16, 64, 128, 0):
            seconds, actor_rise, rollout_rise = [], [], []
            for _ in range(args.repeats):
                version += 1
                before_a, before_r = reset_peak(ranks), reset_peak([rollout_proc.pid])
                start = time.perf_counter()
                actor.call(
                    "PushWeights",
                    actor_pb2.PushWeightsRequest(
                        rollout_address=rollout_address,
                        transport="shm",
                        version=version,
                        bucket_bytes=bucket_mb * MiB if bucket_mb else 1 << 40,
                    ),
                )
                seconds.append(time.perf_counter() - start)
                actor_rise.append(rise(before_a))
                rollout_rise.append(rise(before_r))
            n = len(weights.plan(specs, bucket_mb * MiB if bucket_mb else 1 << 40))
            print(
                f"| {f'{bucket_mb} MiB' if bucket_mb else 'whole'} | {n} | {statistics.median(seconds):.2f} | "
                f"{max(actor_rise) / MiB:,.0f} MiB | {max(rollout_rise) / MiB:,.0f} MiB | "
                f"{segment_bytes(rollout_proc.pid) / MiB:,.0f} MiB |",
                flush=True,
            )
    finally:
        for p in (actor_proc, rollout_proc):
            p.terminate()
            p.wait(120)


if __name__ == "__main__":
    main()
