"""LoRA against full fine-tuning on a ~100M-parameter model built locally (issue 30): the bytes and seconds
of a weight push, and the actor's peak memory and step time.

One actor service per configuration, all alive at once: full fine-tuning, LoRA rank 8 and LoRA rank 64
(peft, every linear layer of the blocks, alpha 16), each on the plain engine (1 rank, fp32, no mixed
precision, no gradient checkpointing) and each with its own HF rollout service (fp32; max_lora_rank the
actor's rank), so every rollout only ever sees one kind of push. In each round every actor runs one PPO
Update of the same fixed batch (rows x tokens, one micro-batch, one optimizer step) and then pushes
over shm and over stream; the configurations take turns within a round, so the noise of this shared
machine falls on all of them alike. The first round is a warm-up (the rollout's first adapter push wraps its model
with peft) and is left out of the medians. Push seconds are the PushWeights call as the client sees it
(gather, transfer, the rollout's load and version check); bytes are what the actor reports it sent,
weights as the actor holds them (fp32). An adapter push is adapter-only (no merge_lora).

Memory is each actor process's peak RSS (VmHWM from /proc) over its whole life: loading, the updates and
the pushes, as a run holds them; "after load" is its RSS before the first Update. "Over the floor"
takes away the peak of an actor service started without a model (torch, gRPC, the process group), which
every configuration pays alike. The services run with glibc's mmap threshold fixed at 1 MiB
(MALLOC_MMAP_THRESHOLD_, as bench/push_memory_bench.py does), so that the peak is what the step holds at
once: by default glibc keeps freed activations in its per-thread heaps, and the actor's peak then drifts
from update to update by up to ~1 GiB on this model (seen: LoRA above full fine-tuning in one run, full
fine-tuning's peak 2,204 -> 4,273 MiB over three updates in another). --default-malloc measures with glibc's
defaults instead.

    .venv/bin/python bench/lora_bench.py [--hidden 768] [--layers 12] [--repeats 4] [--default-malloc]
    .venv/bin/python bench/lora_bench.py --hidden 64 --layers 2 --intermediate 128 --heads 4 --kv-heads 2 \
        --rows 2 --tokens 16 --repeats 1 --ranks 8,16   # a quick check of the script itself
"""

import argparse
import math
import os
import pathlib
import shutil
import statistics
import tempfile
import time

from actor_bench import ppo_batch
from push_memory_bench import MiB, family, status
from safetensors import safe_open

from meshrl.codec import Payload
from meshrl.rpc import Client
from meshrl.tiny.models import TinyModelConfig, make_model
from meshrl.v1 import actor_pb2, common_pb2
from orchestrator.lifecycle.services import launch

ACTOR = actor_pb2.DESCRIPTOR.services_by_name["ActorService"]
TRANSPORTS = ("shm", "stream")


def param_count(model: pathlib.Path) -> int:
    with safe_open(str(model / "model.safetensors"), framework="pt") as st:
        return sum(math.prod(st.get_slice(k).get_shape()) for k in st.keys())


class Config:
    """One configuration: an actor service (full or LoRA) and the rollout service it pushes to."""

    def __init__(self, rank: int, model: pathlib.Path, root: pathlib.Path, lr: float, rows: int):
        self.rank = rank
        self.name = f"LoRA rank {rank}" if rank else "full fine-tuning"
        self.rollout_proc, self.rollout_address = launch(
            ["rollout", "--model", str(model), "--backend", "hf", "--max-model-len", "64"]
            + ["--max-lora-rank", str(rank)]
        )
        try:
            self.actor_proc, address = launch(
                ["actor", "--role", "actor", "--model", str(model), "--world-size", "1", "--engine", "plain"]
                + ["--micro-batch-size", str(rows), "--lr", str(lr), "--lora-rank", str(rank)]
                + ["--checkpoint-root", str(root)]
            )
        except RuntimeError:
            self.rollout_proc.terminate()
            raise
        self.actor = Client(address, ACTOR, timeout=600)
        self.pids = family(self.actor_proc.pid)
        self.rss_after_load = max(status(p, "VmRSS") for p in self.pids)
        self.step_s: list[float] = []
        self.push_s: dict[str, list[float]] = {t: [] for t in TRANSPORTS}
        self.push_bytes = 0

    def update(self, step: int, data, keep: bool) -> None:
        start = time.perf_counter()
        request = Payload(actor_pb2.UpdateRequest(step=step, loss=actor_pb2.LossSpec(name="ppo")), data)
        self.actor.call_message("Update", request, actor_pb2.UpdateResponse)
        if keep:
            self.step_s.append(time.perf_counter() - start)

    def push(self, transport: str, version: int, keep: bool) -> None:
        start = time.perf_counter()
        request = actor_pb2.PushWeightsRequest(
            rollout_address=self.rollout_address, transport=transport, version=version
        )
        reply = self.actor.call_message("PushWeights", request, actor_pb2.PushWeightsResponse)
        if keep:
            self.push_s[transport].append(time.perf_counter() - start)
        self.push_bytes = reply.num_bytes

    def peak(self) -> int:
        return max(status(p, "VmHWM") for p in self.pids)

    def stop(self) -> None:
        for p in (self.actor_proc, self.rollout_proc):
            p.terminate()
            p.wait(120)


def floor_peak() -> int:
    """The peak RSS of an actor service without a model (torch, gRPC, the process group): what every
    configuration holds before it reads a weight."""
    proc, address = launch(["actor", "--role", "actor", "--world-size", "1"])
    try:
        Client(address, ACTOR, timeout=600).call("Describe", common_pb2.DescribeRequest())
        return max(status(p, "VmHWM") for p in family(proc.pid))
    finally:
        proc.terminate()
        proc.wait(120)


def tables(configs: list[Config], floor: int) -> str:
    full = configs[0]
    med = statistics.median
    lines = [
        "| configuration | push bytes | full / this | "
        + " | ".join(f"{t} push (median) | full / this" for t in TRANSPORTS)
        + " |",
        "|---" * (3 + 2 * len(TRANSPORTS)) + "|",
    ]
    for c in configs:
        cells = [c.name, f"{c.push_bytes / MiB:,.2f} MiB", f"{full.push_bytes / c.push_bytes:,.1f}x"]
        for t in TRANSPORTS:
            cells += [f"{med(c.push_s[t]) * 1e3:,.0f} ms", f"{med(full.push_s[t]) / med(c.push_s[t]):,.1f}x"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "| configuration | step (median) | this / full | RSS after load | peak RSS | this / full "
        "| peak over the floor | this / full |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in configs:
        lines.append(
            f"| {c.name} | {med(c.step_s):,.2f} s | {med(c.step_s) / med(full.step_s):.2f} | "
            f"{c.rss_after_load / MiB:,.0f} MiB | {c.peak() / MiB:,.0f} MiB | {c.peak() / full.peak():.2f} | "
            f"{(c.peak() - floor) / MiB:,.0f} MiB | {(c.peak() - floor) / (full.peak() - floor):.2f} |"
        )
    lines.append(f"\nfloor (an actor service without a model): peak RSS {floor / MiB:,.0f} MiB")
    return "\n".join(lines + ["", *(goals(c, full) for c in configs if c.rank == 8)])


def goals(c: Config, full: Config) -> str:
    """Issue 30's goals at rank 8, met or not."""
    med = statistics.median
    checks = [(f"bytes >= 50x fewer: {full.push_bytes / c.push_bytes:.1f}x", full.push_bytes / c.push_bytes >= 50)]
    for t in TRANSPORTS:
        x = med(full.push_s[t]) / med(c.push_s[t])
        checks.append((f"{t} push >= 10x faster: {x:.1f}x", x >= 10))
    checks.append((f"peak RSS <= 0.6x full: {c.peak() / full.peak():.2f}x", c.peak() <= 0.6 * full.peak()))
    return "goals at rank 8: " + "; ".join(f"{text} ({'met' if ok else 'missed'})" for text, ok in checks)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--intermediate", type=int, default=3072)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128, help="per row: a quarter prompt, the rest response")
    ap.add_argument("--repeats", type=int, default=4, help="measured rounds, after one warm-up round")
    ap.add_argument("--ranks", default="8,64", help="LoRA ranks, each against full fine-tuning")
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--default-malloc", action="store_true", help="leave glibc's mmap threshold dynamic")
    args = ap.parse_args()
    if not args.default_malloc:
        os.environ["MALLOC_MMAP_THRESHOLD_"] = str(MiB)  # the services inherit it (see above)
    tmp = pathlib.Path(tempfile.mkdtemp())
    cfg = TinyModelConfig(
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=args.heads,
        num_kv_heads=args.kv_heads,
        intermediate_size=args.intermediate,
    )
    model = make_model(tmp / "lm", cfg)
    prompt = args.tokens // 4
    print(
        f"model: Llama, hidden {args.hidden}, {args.layers} layers, {args.heads} heads ({args.kv_heads} kv), "
        f"MLP {args.intermediate}, {param_count(model):,} parameters (fp32); batch {args.rows} x {args.tokens} "
        f"tokens; {args.repeats} measured rounds; glibc mmap threshold "
        f"{'dynamic (default)' if args.default_malloc else '1 MiB'}\n",
        flush=True,
    )
    data = ppo_batch(args.rows, prompt, args.tokens - prompt)
    floor = floor_peak()
    configs: list[Config] = []
    try:
        for rank in [0] + [int(r) for r in args.ranks.split(",")]:  # 0, full fine-tuning, first: the baseline
            configs.append(Config(rank, model, tmp, args.lr, args.rows))
        for step in range(1, args.repeats + 2):
            keep = step > 1  # round 1 warms up
            for c in configs:
                c.update(step, data, keep)
                for i, t in enumerate(TRANSPORTS):
                    c.push(t, step * len(TRANSPORTS) + i, keep)
        print(tables(configs, floor), flush=True)
    finally:
        for c in configs:
            c.stop()
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
