"""Rollout/actor parity after weight pushes for mixtures of experts: per family (tiny Qwen3-MoE, Mixtral,
Qwen2-MoE, and a dense Qwen2 as the control) and rollout backend (hf, vLLM), rollout/kl_to_actor (the mean
|rollout - actor| log-prob of the rollout's samples) before any push and after each of two SFT updates and
pushes, in fp32.

    .venv/bin/python bench/moe_parity_bench.py                        # every family, both backends (~5 min)
    .venv/bin/python bench/moe_parity_bench.py --families qwen3_moe --backends vllm

Each row starts an actor service (one rank) and a rollout service on a fresh model folder, and samples
two responses to each of three prompts per measurement. Prints a markdown table for bench/RESULTS.md.
"""

import argparse
import dataclasses
import pathlib
import random
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from meshrl.algos.rollout_correction import kl_to_actor  # noqa: E402
from meshrl.codec import Payload  # noqa: E402
from meshrl.codec.values import to_value  # noqa: E402
from meshrl.dataproto import DataProto  # noqa: E402
from meshrl.layout import rollout_tensors  # noqa: E402
from meshrl.rpc import Client  # noqa: E402
from meshrl.tiny.models import MOE, TinyModelConfig, make_model  # noqa: E402
from meshrl.v1 import actor_pb2, rollout_pb2  # noqa: E402
from orchestrator.lifecycle.services import launch  # noqa: E402

PROMPTS = DataProto(non_tensor_batch={"prompt": [[{"role": "user", "content": q}] for q in ("1+1=", "12*3=", "7-2=")]})
ROLLOUT = rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"]
ACTOR = actor_pb2.DESCRIPTOR.services_by_name["ActorService"]


def sft_batch(seed: int) -> DataProto:
    """Four random sequences in verl's layout: an SFT update on them moves every weight."""
    rng = random.Random(seed)
    ids = [[rng.randrange(4, 90) for _ in range(rng.randint(3, 8))] for _ in range(8)]
    return DataProto(rollout_tensors(ids[:4], ids[4:], 0))


def parity(family: str, backend: str, root: pathlib.Path) -> list[float]:
    sizes = TinyModelConfig(family=family, num_experts=4, hidden_size=128, intermediate_size=256, num_heads=2)
    folder = make_model(root / family, dataclasses.replace(sizes, num_layers=2, num_kv_heads=1))
    procs = []
    try:
        proc, address = launch(["rollout", "--model", str(folder), "--backend", backend, "--max-model-len", "128"])
        procs.append(proc)
        rollout = Client(address, ROLLOUT, timeout=300)
        proc, at = launch(["actor", "--role", "actor", "--model", str(folder), "--world-size", "1", "--lr", "1e-2"])
        procs.append(proc)
        actor = Client(at, ACTOR, timeout=300)
        out = []
        for version in (0, 1, 2):
            if version:
                spec = actor_pb2.LossSpec(name="sft", params={"ppo_epochs": to_value(1, "ppo_epochs")})
                actor.call("Update", Payload(actor_pb2.UpdateRequest(step=version, loss=spec), sft_batch(version)))
                actor.call("PushWeights", actor_pb2.PushWeightsRequest(rollout_address=address, version=version))
            sampling = rollout_pb2.SamplingParams(n=2, temperature=1.0, max_new_tokens=8, logprobs=True, seed=version)
            request = Payload(rollout_pb2.GenerateRequest(sampling=sampling), PROMPTS)
            _, data = rollout.call_batch("Generate", request, rollout_pb2.GenerateResponse)
            _, lps = actor.call_batch(
                "ComputeLogProbs", Payload(actor_pb2.BatchRequest(), data), actor_pb2.BatchResponse
            )
            lp = lps.batch["actor_logprobs"]
            out.append(kl_to_actor(data.batch["rollout_logprobs"], lp, data.batch["response_mask"]))
        return out
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--families", default=",".join((*MOE, "qwen2")))
    p.add_argument("--backends", default="hf,vllm")
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as root:
        for family in args.families.split(","):
            for backend in args.backends.split(","):
                rows.append((family, backend, parity(family, backend, pathlib.Path(root) / backend)))
    print("| family | backend | before a push | after push 1 | after push 2 |")
    print("|---|---|---|---|---|")
    for family, backend, kl in rows:
        print(f"| {family} | {backend} | " + " | ".join(f"{x:.1e}" for x in kl) + " |")


if __name__ == "__main__":
    main()
