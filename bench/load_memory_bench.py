"""Peak host memory of each actor rank once the model is loaded and sharded: fsdp2 (rank 0 reads the
weights, the other ranks build the model on the meta device and receive their shards) against fsdp1
(every rank reads the whole model, then shards it), on the same model and world size.

The actor service is started with --model, so it loads and shards at start; the
figure is each rank's peak RSS (VmHWM) once it answers, and its RSS then. The
same process without a model (torch, grpc, the process group) is the floor.

    .venv/bin/python bench/load_memory_bench.py [--layers 8] [--hidden 1024] [--world-size 2]
"""

import argparse
import pathlib
import tempfile

from push_memory_bench import MiB, family, sized_model, status

from meshrl.rpc import Client
from meshrl.v1 import actor_pb2, common_pb2
from orchestrator.lifecycle.services import launch

ACTOR = actor_pb2.DESCRIPTOR.services_by_name["ActorService"]


def ranks_memory(args: list[str]) -> list[tuple[int, int]]:
    """(peak RSS, RSS) of each rank of an actor service started with args, once it answers."""
    proc, address = launch(["actor", "--role", "actor", *args])
    try:
        Client(address, ACTOR, timeout=600).call("Describe", common_pb2.DescribeRequest())
        return [(status(p, "VmHWM"), status(p, "VmRSS")) for p in family(proc.pid)]
    finally:
        proc.terminate()
        proc.wait(120)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--world-size", type=int, default=2)
    args = ap.parse_args()
    tmp = pathlib.Path(tempfile.mkdtemp())
    model, size = sized_model(tmp / "lm", args.layers, args.hidden)
    world = ["--world-size", str(args.world_size), "--checkpoint-root", str(tmp)]
    print(f"model: {size / MiB:,.0f} MiB of safetensors, {args.world_size} ranks\n")
    print("| engine | rank | peak RSS | RSS after load | peak over the floor |")
    print("|---|---|---|---|---|")
    floor = ranks_memory(world)
    for rank, (peak, rss) in enumerate(floor):
        print(f"| no model | {rank} | {peak / MiB:,.0f} MiB | {rss / MiB:,.0f} MiB | |")
    for engine in ("fsdp2", "fsdp1"):
        for rank, (peak, rss) in enumerate(ranks_memory([*world, "--model", str(model), "--engine", engine])):
            print(
                f"| {engine} | {rank} | {peak / MiB:,.0f} MiB | {rss / MiB:,.0f} MiB | "
                f"{(peak - floor[rank][0]) / MiB:,.0f} MiB |",
                flush=True,
            )


if __name__ == "__main__":
    main()
