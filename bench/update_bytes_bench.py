"""Bytes an Update carries from the orchestrator to the actor, and the orchestrator's time to encode them,
for a large synthetic GRPO step: every tensor and column of the step's batch (as an Update sent it before
the loss table, meshrl/config/losses.py UPDATE_LOSSES) against the tensors the loss reads
(update_inputs: what Mesh.update sends now).

    .venv/bin/python bench/update_bytes_bench.py                 # 512 prompts x 16 samples, 1,024 tokens
    .venv/bin/python bench/update_bytes_bench.py --prompts 64    # smaller

The batch: prompts of 64-256 tokens, responses of 64-1,024 (uniform), verl's layout as the rollout
returns it (meshrl.layout.rollout_tensors), the step's advantages and returns, and the text columns a
step holds (the prompt messages, the response text, the reward's ground truth, ids). Prints a markdown
table for bench/RESULTS.md.
"""

import argparse
import random
import statistics
import time

import numpy as np
import torch

from meshrl.codec import encode_message
from meshrl.config.losses import PARAMS, update_inputs
from meshrl.dataproto import DataProto
from meshrl.layout import rollout_tensors
from meshrl.typed import build
from meshrl.v1 import actor_pb2
from orchestrator.lifecycle.mesh import POLICY_TENSORS


def step_batch(prompts: int, n: int, max_response: int, seed: int = 0) -> DataProto:
    rng = random.Random(seed)
    rows = prompts * n
    prompt_ids = [[rng.randrange(4, 32000) for _ in range(rng.randint(64, 256))] for _ in range(prompts)]
    lengths = [rng.randint(64, max_response) for _ in range(rows)]
    responses = [[rng.randrange(4, 32000) for _ in range(k)] for k in lengths]
    logprobs = [[-1.0] * k for k in lengths]
    tensors = rollout_tensors([prompt_ids[i // n] for i in range(rows)], responses, 0, logprobs=logprobs)
    mask = tensors["response_mask"]
    advantages = torch.randn(rows, 1) * mask
    tensors |= {"advantages": advantages, "returns": advantages.clone()}
    texts = {
        "prompt": np.array([[{"role": "user", "content": "x" * 600}] for i in range(rows)], dtype=object),
        "response_text": np.array(["y" * (3 * k) for k in lengths], dtype=object),
        "reward_model": np.array([{"ground_truth": "42"} for _ in range(rows)], dtype=object),
        "data_source": np.array(["arithmetic"] * rows, dtype=object),
        "uid": np.array([f"u{i // n}" for i in range(rows)], dtype=object),
    }
    return DataProto(tensors, texts)


def encoded(batch: DataProto, repeats: int) -> tuple[int, float]:
    """(bytes of the Update request, median seconds to encode it)."""
    msg = actor_pb2.UpdateRequest(step=1, loss=actor_pb2.LossSpec(name="ppo"))
    times, size = [], 0
    for _ in range(repeats):
        t = time.perf_counter()
        size = len(encode_message(msg, batch))
        times.append(time.perf_counter() - t)
    return size, statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=512)
    p.add_argument("--n", type=int, default=16)
    p.add_argument("--max-response", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    batch = step_batch(args.prompts, args.n, args.max_response)
    params = build(PARAMS["ppo"], {"old_logprobs_key": ""}, "loss ppo")  # the default step: reuse_logprobs
    lean = batch.select([k for k in update_inputs("ppo", params, batch.batch) if k in batch.batch], [], [])
    # before: the step's batch as policy_gradient built it (its policy tensors, the rollout's log-probs,
    # advantages and returns) with every text column it carried
    before = batch.select([*POLICY_TENSORS, "rollout_logprobs", "advantages", "returns"])
    rows = [("the step's batch, texts included (before)", *encoded(before, args.repeats))]
    rows.append(("what the loss reads (now)", *encoded(lean, args.repeats)))
    print(f"{args.prompts} prompts x {args.n} samples, responses up to {args.max_response} tokens, {len(batch)} rows\n")
    print("| Update carries | MB | encode s | vs before |")
    print("|---|---|---|---|")
    for name, size, seconds in rows:
        print(f"| {name} | {size / 1e6:.0f} | {seconds:.2f} | {rows[0][1] / size:.2f}x fewer bytes |")
    print("\ntensors now:", ", ".join(lean.batch))


if __name__ == "__main__":
    main()
