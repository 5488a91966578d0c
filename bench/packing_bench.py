"""Padded against packed (actor.padding_free) actor passes: real tokens per second of a forward and
backward over one batch, cut into micro-batches by a token budget the way the actor cuts them
(services/actor/batches.py: rows of similar length together, each pass trimmed to its longest row; a
packed budget counts real tokens), in one process on the CPU. The batch is what a GRPO step sees:
8 samples of each prompt, responses of varied length up to --max-response. Each variant also with
actor.share_prompts (a group's prompt run once: padded, the shared-prompt pass; packed, in the same
packed row). All runs in one process, alternating, the same batch; the figure is the median of --repeats.
`--device cuda --dtype bf16` runs it on a GPU, where the packed passes take flash-attention's varlen kernel.

    .venv/bin/python bench/packing_bench.py [--model tiny|50m|190m] [--repeats 3] [--budget 4096]
        [--prompts 8] [--max-response 128] [--prompt-len 20,60] [--device cpu|cuda] [--dtype fp32|bf16]
"""

import argparse
import statistics
import tempfile
import time

import torch

from meshrl.dataproto import DataProto
from meshrl.layout import rollout_tensors
from meshrl.models import load_model
from meshrl.tiny.models import TinyModelConfig, make_model
from services.actor import packing
from services.actor.batches import token_groups, trimmed
from services.actor.model import forward_response, token_logprobs

MODELS = {
    "tiny": TinyModelConfig(),
    "50m": TinyModelConfig(hidden_size=640, num_layers=8, num_heads=10, num_kv_heads=5, intermediate_size=2560),
    "190m": TinyModelConfig(hidden_size=1024, num_layers=12, num_heads=16, num_kv_heads=8, intermediate_size=4096),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
KEYS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")


def grpo_batch(prompts: int, n: int, max_response: int, vocab: int, prompt_len=(20, 60)) -> DataProto:
    """prompts x n rows in verl's layout: prompts of prompt_len tokens, responses of 1..max_response (uniform)."""
    g = torch.Generator().manual_seed(0)
    plen = torch.randint(prompt_len[0], prompt_len[1] + 1, (prompts,), generator=g).repeat_interleave(n)
    rlen = torch.randint(1, max_response + 1, (prompts * n,), generator=g)
    prompt = [
        torch.randint(3, vocab, (p,), generator=torch.Generator().manual_seed(i // n)).tolist()
        for i, p in enumerate(plen.tolist())
    ]
    response = [torch.randint(3, vocab, (r,), generator=g).tolist() for r in rlen.tolist()]
    return DataProto(rollout_tensors(prompt, response, 0))


def step(model, data: DataProto, budget: int, packed: bool, share: bool) -> float:
    """Seconds for forward and backward over every micro-batch (the gradients are dropped)."""
    start = time.perf_counter()
    device = next(model.parameters()).device
    for rows in token_groups(data, budget, shared=share, packed=packed):
        mb = {k: t.to(device) for k, t in trimmed(data, rows, KEYS).items()}
        lp = token_logprobs(forward_response(model, mb, share_prompts=share), mb["responses"])
        (-(lp.float() * mb["response_mask"]).sum()).backward()
    model.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize()  # the kernels are queued: the time is when the last ends
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="tiny", choices=sorted(MODELS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budget", type=int, default=4096)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-response", type=int, default=128)
    parser.add_argument("--prompt-len", default="20,60", help="MIN,MAX tokens of a prompt (uniform)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    args = parser.parse_args()
    path = make_model(tempfile.mkdtemp(), MODELS[args.model])
    padded, flat = (load_model(str(path), "causal").to(args.device, DTYPES[args.dtype]) for _ in range(2))
    packing.enable(flat)
    prompt_len = tuple(int(x) for x in args.prompt_len.split(","))
    data = grpo_batch(args.prompts, 8, args.max_response, padded.config.vocab_size, prompt_len)
    real = int(data.batch["attention_mask"].sum())
    grid = data.batch["attention_mask"].numel()
    variants = {  # name: (model, packed, shared)
        "padded": (padded, False, False),
        "packed": (flat, True, False),
        "padded, shared prompts": (padded, False, True),
        "packed, shared prompts": (flat, True, True),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    for model, packed, share in variants.values():  # warm-up
        step(model, data, args.budget, packed, share)
    for _ in range(args.repeats):
        for name, (model, packed, share) in variants.items():
            times[name].append(step(model, data, args.budget, packed, share))
    med = {k: statistics.median(v) for k, v in times.items()}
    if args.device == "cuda":  # after the runs: a kernel that failed has turned itself off by now
        kernel = packing.varlen_attn is not None and not packing.OFF
        print(f"{torch.cuda.get_device_name()}, {args.dtype}, packed attention through the varlen kernel: {kernel}")
    print(
        f"{args.model}: {len(data)} rows, {real} real tokens ({real / grid:.0%} of the padded grid), budget "
        f"{args.budget}, median of {args.repeats}\n"
    )
    print("| pass | real tokens/s | time / padded |\n|---|---|---|")
    for name in variants:
        print(f"| {name} | {real / med[name]:.0f} | {med[name] / med['padded']:.2f}x |")


if __name__ == "__main__":
    main()
