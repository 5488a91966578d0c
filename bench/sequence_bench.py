"""One long sequence on one rank against the same sequence split over two (actor.sequence_parallel=2,
services/actor/sequence.py; issue 46 item 4).

A Qwen2 of ~50M parameters (hidden 512, 8 layers, 8 heads, 2 key/value heads, a 32k vocabulary), one
row of 32 + RESPONSE tokens: a ComputeLogProbs, then one PPO update with AdamW, through the actor's rank
handler (the service's code without gRPC), fsdp2 on gloo, with or without gradient checkpointing. One
rank with both cores, against two ranks of one core each holding the same row, each running half its
tokens. Reported per rank: the process's peak RSS (VmHWM), and the passes' seconds.

    .venv/bin/python bench/sequence_bench.py [--response 8160] [--checkpointing]
"""

import argparse
import json
import os
import pathlib
import resource
import subprocess
import sys
import tempfile
import time

from actor_bench import ppo_batch

from meshrl.tiny.models import TinyModelConfig, make_model

MODEL = TinyModelConfig(
    family="qwen2",
    hidden_size=512,
    intermediate_size=2048,
    num_layers=8,
    num_heads=8,
    num_kv_heads=2,
    vocab_multiple=32_768,
    max_position_embeddings=16_384,
)
PROMPT = 32


def rank_job(model: str, split: int, response: int, recompute: bool, out: str) -> None:
    import torch.distributed as dist

    from services.actor.handler import RankHandler
    from services.actor.launch import join_group

    join_group()
    handler = RankHandler("actor")
    engine = {"engine": "fsdp2", "micro_batch_size": 1, "gradient_checkpointing": recompute, "sequence_parallel": split}
    handler.init({"model": model, "engine": engine, "optim": {"lr": 1e-6}})
    data = ppo_batch(1, PROMPT, response)
    t0 = time.perf_counter()
    handler.logprobs({"temperature": 1.0, "with_entropy": True}, data)
    logprobs_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    handler.update({"loss": "ppo", "params": {}, "total_rows": 1, "step": 1}, data)
    update_s = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    pathlib.Path(out).write_text(json.dumps({"peak_mib": peak, "update_s": update_s, "logprobs_s": logprobs_s}))
    dist.destroy_process_group()


def measure(model: str, world: int, response: int, recompute: bool) -> list[dict]:
    from services.actor.launch import new_store, rank_env

    store, outs, procs = new_store(), [], []
    for rank in range(world):
        outs.append(tempfile.mktemp(suffix=".json"))
        env = {**os.environ, **rank_env(rank, world, store), "OMP_NUM_THREADS": str(2 // world)}
        args = [model, str(world), str(response), str(int(recompute)), outs[-1]]
        procs.append(subprocess.Popen([sys.executable, __file__, "--rank-job", *args], env=env))
    for p in procs:
        if p.wait() != 0:
            raise SystemExit(f"a rank failed ({p.returncode})")
    return [json.loads(pathlib.Path(o).read_text()) for o in outs]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--response", type=int, default=8160)
    ap.add_argument("--checkpointing", action="store_true", help="gradient checkpointing")
    ap.add_argument("--rank-job", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_job:
        model, split, response, recompute, out = args.rank_job
        import torch

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        return rank_job(model, int(split), int(response), recompute == "1", out)
    path = make_model(pathlib.Path(tempfile.mkdtemp()) / "qwen2", MODEL)
    from safetensors.torch import load_file

    n = sum(t.numel() for t in load_file(path / "model.safetensors").values())
    recompute = "on" if args.checkpointing else "off"
    print(f"{n / 1e6:.1f}M parameters, 1 row of {PROMPT} + {args.response} tokens, fp32, checkpointing {recompute}")
    print("| ranks | sequence_parallel | peak RSS per rank | ComputeLogProbs | update |\n|---|---|---|---|---|")
    for world in (1, 2):
        ranks = measure(str(path), world, args.response, args.checkpointing)
        peak = max(r["peak_mib"] for r in ranks)
        print(
            f"| {world} x {2 // world} threads | {world} | {peak / 1024:.2f} GiB | "
            f"{ranks[0]['logprobs_s']:.1f} s | {ranks[0]['update_s']:.1f} s |",
            flush=True,
        )


if __name__ == "__main__":
    main()
