"""The actor's peak memory on long responses with a real vocabulary: the head by chunks (services/actor/head.py)
against the full-logits pass, with glibc's defaults and with MALLOC_MMAP_THRESHOLD_ fixed (issue 46 item 5).

A Qwen2 of ~25M parameters with Qwen's 151,936-token vocabulary (tied embeddings), one rank of the actor's
handler in its own process per configuration (the service's code without gRPC), fsdp2 on gloo: a
ComputeLogProbs with entropy, then one PPO update (one micro-batch of 4 rows x (32 + response) tokens,
AdamW). Reported: the process's peak RSS (VmHWM) and the update's seconds.

    .venv/bin/python bench/head_memory_bench.py [--response 1024] [--dtype fp32|bf16]
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
    hidden_size=160,
    intermediate_size=640,
    num_layers=4,
    num_heads=4,
    num_kv_heads=2,
    vocab_multiple=151_936,  # the tokenizer's few ids rounded up to Qwen2's vocabulary
    tie_word_embeddings=True,
    max_position_embeddings=4096,
)
ROWS, PROMPT = 4, 32
MiB = 2**20


def rank_job(model: str, mode: str, response: int, mixed: bool, out: str) -> None:
    import torch.distributed as dist

    from services.actor import head
    from services.actor.handler import RankHandler
    from services.actor.launch import join_group

    if mode == "full":
        head.output_head = lambda model: None  # the full-logits pass, as before the chunked head
    join_group()
    handler = RankHandler("actor")
    engine = {"engine": "fsdp2", "micro_batch_size": ROWS, "mixed_precision": mixed}
    handler.init({"model": model, "engine": engine, "optim": {"lr": 1e-6}})
    data = ppo_batch(ROWS, PROMPT, response)
    t0 = time.perf_counter()
    handler.logprobs({"temperature": 1.0, "with_entropy": True}, data)
    logprobs_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    handler.update({"loss": "ppo", "params": {}, "total_rows": ROWS, "step": 1}, data)
    update_s = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    pathlib.Path(out).write_text(json.dumps({"peak_mib": peak, "update_s": update_s, "logprobs_s": logprobs_s}))
    dist.destroy_process_group()


def measure(model: str, mode: str, response: int, mixed: bool, mmap: bool) -> dict:
    from services.actor.launch import new_store, rank_env

    out = tempfile.mktemp(suffix=".json")
    env = {**os.environ, **rank_env(0, 1, new_store())}
    env.pop("MALLOC_MMAP_THRESHOLD_", None)
    if mmap:
        env["MALLOC_MMAP_THRESHOLD_"] = str(MiB)
    args = [model, mode, str(response), str(int(mixed)), out]
    subprocess.run([sys.executable, __file__, "--rank-job", *args], env=env, check=True)
    return json.loads(pathlib.Path(out).read_text())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--response", type=int, default=1024)
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--rank-job", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_job:
        model, mode, response, mixed, out = args.rank_job
        return rank_job(model, mode, int(response), mixed == "1", out)
    path = make_model(pathlib.Path(tempfile.mkdtemp()) / "qwen2", MODEL)
    from safetensors.torch import load_file

    n = sum(t.numel() for t in load_file(path / "model.safetensors").values())
    mixed = args.dtype == "bf16"
    print(f"{n / 1e6:.1f}M parameters, {ROWS} x ({PROMPT} + {args.response}) tokens, {args.dtype}")
    print("| head | MALLOC_MMAP_THRESHOLD_ | peak RSS | ComputeLogProbs | update |\n|---|---|---|---|---|")
    for mode in ("full", "chunked"):
        for mmap in (False, True):
            r = measure(str(path), mode, args.response, mixed, mmap)
            print(
                f"| {mode} | {'1 MiB' if mmap else 'unset'} | {r['peak_mib'] / 1024:.2f} GiB | "
                f"{r['logprobs_s']:.1f} s | {r['update_s']:.1f} s |",
                flush=True,
            )


if __name__ == "__main__":
    main()
