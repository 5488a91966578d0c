"""Delta weight pushes against full ones (meshrl/delta.py, issue 63), at Qwen2.5-0.5B's shape, bf16 rollouts.

    .venv/bin/python bench/delta_bench.py [--steps 20] [--lrs 1e-6,1e-5] [--model 0.5B]
    .venv/bin/python bench/delta_bench.py --part fleet [--steps 5] [--model "~125 MB"]

(a) A random Qwen2 of the model's shape trains in this process: fp32 master weights, AdamW at each lr, one
batch of 2x16 random tokens per step (the gradients are real, the data meaningless). After each step its
weights, cast to bf16, are pushed to two HF rollout services in bf16 (their own processes): one takes delta
pushes, the other full pushes, over shm on even steps and stream on odd ones. Per lr: the share of bf16
values that changed per step, bytes per push (full, delta), push seconds per transport (full, delta; the
median over the steps), and whether the two rollouts then give identical log-probs for the same samples.

(b) --part fleet: two replicas on two loopback "nodes" (127.0.0.2, 127.0.0.3) take each push over stream
down a chain (rollout.weight_relay): the bytes the actor's node sends per step, delta against full (the
chain's second hop carries as many again).
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from rollout_bench import SYNC_MODELS
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from meshrl import weights
from meshrl.codec import Payload
from meshrl.dataproto import DataProto
from meshrl.delta import Base
from meshrl.rpc import Client
from meshrl.tiny.models import make_model
from meshrl.v1 import rollout_pb2

SERVICE = rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"]
BUCKET = weights.DEFAULT_BUCKET_BYTES  # --bucket-mb


def start(model: str, host: str = "127.0.0.1") -> tuple[subprocess.Popen, Client]:
    cmd = [sys.executable, "-m", "cli", "serve", "rollout", "--model", model, "--backend", "hf", "--dtype"]
    proc = subprocess.Popen(
        [*cmd, "bfloat16", "--max-model-len", "64", "--host", host], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    while line and "listening on" not in line:
        line = proc.stdout.readline()
    return proc, Client(line.split()[-1], SERVICE, timeout=1200)


class Trainer:
    def __init__(self, model: str, lr: float):
        torch.manual_seed(0)
        self.model = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.0)
        self.names = list(load_file(f"{model}/model.safetensors").keys())  # the files' (a tied head is not)
        self.vocab = self.model.config.vocab_size

    def step(self) -> None:
        ids = torch.randint(0, self.vocab, (2, 16))
        loss = self.model(input_ids=ids, labels=ids).loss
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def sent(self) -> dict[str, torch.Tensor]:
        state = self.model.state_dict()
        return {k: state[k].detach().to(torch.bfloat16) for k in self.names}


def logprobs(client: Client) -> torch.Tensor:
    ids = torch.randint(4, 100, (4, 12), generator=torch.Generator().manual_seed(0))
    data = DataProto({"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    sampling = rollout_pb2.SamplingParams(n=1, temperature=0.0, max_new_tokens=8, logprobs=True, seed=0)
    _, out = client.call_batch(
        "Generate", Payload(rollout_pb2.GenerateRequest(sampling=sampling), data), rollout_pb2.GenerateResponse
    )
    return out.batch["rollout_logprobs"]


def changed_share(before: dict, after: dict) -> float:
    diff = sum(int((before[k].view(torch.int16) != after[k].view(torch.int16)).sum()) for k in after)
    return diff / sum(t.numel() for t in after.values())


def single(model: str, lr: float, steps: int) -> None:
    trainer = Trainer(model, lr)
    (pd, delta), (pf, full) = start(model), start(model)
    base, rows = Base(), []
    try:
        before = trainer.sent()
        for version in range(1, steps + 1):
            trainer.step()
            named = trainer.sent()
            transport = "shm" if version % 2 == 0 else "stream"
            d = weights.push_state(delta, named, version, transport, bucket_bytes=BUCKET, base=base)
            f = weights.push_state(full, named, version, transport, bucket_bytes=BUCKET)
            rows.append((transport, changed_share(before, named), d, f))
            before = named
        same = torch.equal(logprobs(delta), logprobs(full))
    finally:
        for p in (pd, pf):
            p.terminate()
            p.wait()
    report(lr, rows[1:], same)  # the first push starts the base: whole


def report(lr: float, rows: list, same: bool) -> None:
    share = [r[1] for r in rows]
    ratio = [r[3]["sent_bytes"] / r[2]["sent_bytes"] for r in rows]
    cells = [f"{lr:g}", f"{statistics.median(share):.2%} ({min(share):.2%}-{max(share):.2%})"]
    cells += [
        f"{rows[0][3]['sent_bytes'] / 2**20:,.0f} MiB",
        f"{statistics.median(r[2]['sent_bytes'] for r in rows) / 2**20:,.1f} MiB",
    ]
    cells.append(f"{statistics.median(ratio):.1f}x")
    for transport in ("shm", "stream"):
        mine = [r for r in rows if r[0] == transport]
        f, d = (statistics.median(r[i]["seconds"] for r in mine) for i in (3, 2))
        cells.append(f"{f:.2f} s / {d:.2f} s ({f / d:.2f}x)")
    cells.append("identical" if same else "DIFFER")
    print("| " + " | ".join(cells) + " |", flush=True)


def fleet(model: str, lr: float, steps: int) -> None:
    trainer = Trainer(model, lr)
    started = [start(model, f"127.0.0.{2 + i % 2}") for i in range(4)]  # two chains: delta, full
    clients = [c for _, c in started]
    base = Base()
    sent: dict[str, list[float]] = {"delta": [], "full": []}
    try:
        for version in range(1, steps + 1):
            trainer.step()
            named = trainer.sent()
            buckets = weights.plan([(k, t.dtype, list(t.shape)) for k, t in named.items()])
            tensors_of = lambda b, named=named: [named[r.name] for r in b.refs]  # noqa: E731
            for kind, chain, keep in (("delta", clients[:2], base), ("full", clients[2:], None)):
                push = weights.Push(version, "stream", relay=True, base=keep, delta=keep is not None)
                stats, failed = weights.push_to_all(chain, buckets, tensors_of, push)
                assert not failed
                sent[kind].append(stats["sent_bytes"])
        same = torch.equal(logprobs(clients[1]), logprobs(clients[3]))  # each chain's far end
    finally:
        for p, _ in started:
            p.terminate()
            p.wait()
    f, d = statistics.median(sent["full"][1:]), statistics.median(sent["delta"][1:])
    print(
        f"| {lr:g} | {f / 2**20:,.1f} MiB | {d / 2**20:,.2f} MiB | {f / d:.1f}x | {'identical' if same else 'DIFFER'} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--part", default="single", choices=["single", "fleet"])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--lrs", default="1e-6,1e-5")
    parser.add_argument("--model", default="0.5B")
    parser.add_argument("--bucket-mb", type=int, default=weights.DEFAULT_BUCKET_BYTES >> 20)
    args = parser.parse_args()
    global BUCKET
    BUCKET = args.bucket_mb << 20
    with tempfile.TemporaryDirectory() as tmp:
        model = str(make_model(f"{tmp}/model", SYNC_MODELS[args.model]))
        t0 = time.perf_counter()
        if args.part == "single":
            print(
                "| lr | bf16 values changed per step | full push | delta push | fewer bytes | shm full / delta "
                "| stream full / delta | rollouts after |\n|---|---|---|---|---|---|---|---|"
            )
        else:
            print("| lr | actor node sends, full | delta | fewer bytes | chain ends after |\n|---|---|---|---|---|")
        for lr in map(float, args.lrs.split(",")):
            (single if args.part == "single" else fleet)(model, lr, args.steps)
        took = time.perf_counter() - t0
        print(f"({args.model}, {args.steps} steps per lr, buckets of {args.bucket_mb} MiB, {took:.0f} s)")


if __name__ == "__main__":
    main()
