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
import pathlib
import random
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

from meshrl.codec import Payload, decode_message, encode_message
from meshrl.config.losses import PARAMS, update_inputs
from meshrl.dataproto import DataProto
from meshrl.layout import rollout_tensors
from meshrl.rpc import Client, serve
from meshrl.typed import build
from meshrl.v1 import actor_pb2, reward_pb2, rollout_pb2
from orchestrator.lifecycle.mesh import POLICY_TENSORS


def step_batch(prompts: int, n: int, max_response: int, seed: int = 0) -> DataProto:
    rng = random.Random(seed)
    rows = prompts * n
    prompt_ids = [[rng.randrange(4, 32000) for _ in range(rng.randint(64, 256))] for _ in range(prompts)]
    lengths = [rng.randint(64, max_response) for _ in range(rows)]
    responses = [[rng.randrange(4, 32000) for _ in range(k)] for k in lengths]
    logprobs = [[-rng.random() for _ in range(k)] for k in lengths]
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


def timed(msg, batch: DataProto, repeats: int, packed: bool) -> tuple[int, float, float]:
    """(bytes of the message, median seconds to encode it, to decode it)."""
    enc, dec, size = [], [], 0
    for _ in range(repeats):
        t = time.perf_counter()
        buf = encode_message(msg, batch, packed=packed)
        enc.append(time.perf_counter() - t)
        t = time.perf_counter()
        decode_message(type(msg), buf)
        dec.append(time.perf_counter() - t)
        size = len(buf)
    return size, statistics.median(enc), statistics.median(dec)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=512)
    p.add_argument("--n", type=int, default=16)
    p.add_argument("--max-response", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--loopback", action="store_true", help="also time the calls through a server process")
    p.add_argument("--serve", choices=["sink", "echo"], help=argparse.SUPPRESS)
    p.add_argument("--packed", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--port-file", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        server = serve(Server(args.serve, args.packed))
        pathlib.Path(args.port_file).write_text(str(server.port))
        server.run_until_signal(grace=0)
        return
    batch = step_batch(args.prompts, args.n, args.max_response)
    params = build(PARAMS["ppo"], {"old_logprobs_key": ""}, "loss ppo")  # the default step: reuse_logprobs
    lean = batch.select([k for k in update_inputs("ppo", params, batch.batch) if k in batch.batch], [], [])
    # before: the step's batch as policy_gradient built it (its policy tensors, the rollout's log-probs,
    # advantages and returns) with every text column it carried
    before = batch.select([*POLICY_TENSORS, "rollout_logprobs", "advantages", "returns"])
    update = actor_pb2.UpdateRequest(step=1, loss=actor_pb2.LossSpec(name="ppo"))
    reply = rollout_pb2.GenerateResponse()
    generated = batch.select([*rollout_tensors([[1]], [[1]], 0, logprobs=[[0.0]])], ["response_text"])
    rows = [
        ("Update", "the step's batch, texts included, padded", *timed(update, before, args.repeats, False)),
        ("Update", "what the loss reads, padded", *timed(update, lean, args.repeats, False)),
        ("Update", "what the loss reads, packed (now)", *timed(update, lean, args.repeats, True)),
        ("Generate reply", "padded", *timed(reply, generated, args.repeats, False)),
        ("Generate reply", "packed (now)", *timed(reply, generated, args.repeats, True)),
    ]
    print(f"{args.prompts} prompts x {args.n} samples, responses up to {args.max_response} tokens, {len(batch)} rows\n")
    print("| message | carries | MB | encode s | decode s | bytes vs the first row |")
    print("|---|---|---|---|---|---|")
    for kind, name, size, enc, dec in rows:
        first = next(r for r in rows if r[0] == kind)
        print(f"| {kind} | {name} | {size / 1e6:.1f} | {enc:.2f} | {dec:.2f} | {first[2] / size:.1f}x fewer |")
    print("\nUpdate tensors:", ", ".join(lean.batch))
    if args.loopback:
        print("\nThrough a server process on loopback gRPC (median of", args.repeats, "calls):\n")
        print("| call | form | wall s | orchestrator CPU s |")
        print("|---|---|---|---|")
        for kind, data in (("sink", lean), ("echo", generated)):
            for packed in (False, True):
                wall, cpu = loopback(kind, data, packed, args.repeats)
                name = "Update (to the actor)" if kind == "sink" else "Generate reply's batch, there and back"
                print(f"| {name} | {'packed' if packed else 'padded'} | {wall:.2f} | {cpu:.2f} |")


class Server:
    """sink: takes the batch, answers with nothing (an Update); echo: answers with the batch it got."""

    SERVICE = reward_pb2.DESCRIPTOR.services_by_name["RewardService"]

    def __init__(self, kind: str, packed: bool):
        self.kind, self.packed = kind, packed

    def Score(self, request, context):
        out = request.data if self.kind == "echo" else None
        return Payload(reward_pb2.ScoreResponse(), out, packed=self.packed)


def loopback(kind: str, data: DataProto, packed: bool, repeats: int) -> tuple[float, float]:
    """(median wall seconds, median CPU seconds of this process, gRPC's threads included) per call."""
    port_file = pathlib.Path(tempfile.mkdtemp()) / "port"
    cmd = [sys.executable, __file__, "--serve", kind, "--port-file", str(port_file), *(["--packed"] if packed else [])]
    proc = subprocess.Popen(cmd)
    try:
        while not (port_file.exists() and port_file.read_text()):
            if proc.poll() is not None:
                raise RuntimeError("benchmark server died")
            time.sleep(0.05)
        with Client(f"127.0.0.1:{port_file.read_text()}", Server.SERVICE, timeout=300) as c:
            c.wait_ready(30)
            request = Payload(reward_pb2.ScoreRequest(), data, packed=packed)
            c.call("Score", request)  # warm-up: HTTP/2 windows grow, fresh pages are touched
            walls, cpus = [], []
            for _ in range(repeats):
                w, u = time.perf_counter(), time.process_time()
                c.call("Score", request)
                walls.append(time.perf_counter() - w)
                cpus.append(time.process_time() - u)
    finally:
        proc.terminate()
        proc.wait()
    return statistics.median(walls), statistics.median(cpus)


if __name__ == "__main__":
    main()
