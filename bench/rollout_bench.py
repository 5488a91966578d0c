"""Rollout benchmark: generation through the service vs the same vLLM engine in process, vLLM vs HF,
and weight handoff (shm, stream) into a running vLLM engine vs np.copy of the same bytes.

    .venv/bin/python bench/rollout_bench.py [--prompts 64] [--n 4] [--max-new-tokens 64]
    .venv/bin/python bench/rollout_bench.py --parts handoff --models 0.5B --backends vllm,hf
    .venv/bin/python bench/rollout_bench.py --parts reload --models "~500 MB"    # vLLM's reload, profiled

Every engine runs alone (one at a time) on this machine; the services run in their own processes.
"""

import argparse
import gc
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
from safetensors.torch import load_file

from meshrl import weights
from meshrl.codec import Payload
from meshrl.dataproto import DataProto
from meshrl.rpc import Client
from meshrl.tiny.models import TinyModelConfig, make_model
from meshrl.v1 import rollout_pb2

SERVICE = rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"]
GEN_MODELS = {
    "tiny": TinyModelConfig(),
    "50m": TinyModelConfig(hidden_size=640, num_layers=8, num_heads=10, num_kv_heads=5, intermediate_size=2560),
}
SYNC_MODELS = {
    "~125 MB": TinyModelConfig(hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=4, intermediate_size=2048),
    "~500 MB": TinyModelConfig(hidden_size=1024, num_layers=8, num_heads=16, num_kv_heads=8, intermediate_size=4096),
    # Qwen2.5-0.5B's shape: 494M parameters, its 151,936-token vocabulary, tied embeddings (issue 46 item 5)
    "0.5B": TinyModelConfig(
        family="qwen2",
        hidden_size=896,
        num_layers=24,
        num_heads=14,
        num_kv_heads=2,
        intermediate_size=4864,
        vocab_multiple=151_936,
        tie_word_embeddings=True,
    ),
}
MAX_LEN = 256


def prompt_ids(count: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [
        torch.randint(4, 100, (int(torch.randint(8, 24, (1,), generator=g)),), generator=g).tolist()
        for _ in range(count)
    ]


def start_service(model: str, backend: str):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cli",
            "serve",
            "rollout",
            "--model",
            model,
            "--backend",
            backend,
            "--max-model-len",
            str(MAX_LEN),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None  # piped
    line = proc.stdout.readline()
    while line and "listening on" not in line:
        line = proc.stdout.readline()
    return proc, Client(line.split()[-1], SERVICE, timeout=1200)


def service_rate(client: Client, prompts, args, repeats: int) -> float:
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    data = DataProto(
        {
            "input_ids": ids,
            "attention_mask": (torch.arange(width) >= width - torch.tensor([len(p) for p in prompts])[:, None]).long(),
        }
    )
    sampling = rollout_pb2.SamplingParams(
        n=args.n, temperature=1.0, max_new_tokens=args.max_new_tokens, logprobs=True, seed=0
    )
    rates = []
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        request = Payload(rollout_pb2.GenerateRequest(sampling=sampling), data)
        _, out = client.call_batch("Generate", request, rollout_pb2.GenerateResponse)
        if i:
            rates.append(out.batch["response_mask"].sum().item() / (time.perf_counter() - t0))
    return statistics.median(rates)


def in_process_rate(model: str, prompts, args, repeats: int) -> float:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from meshrl.config.rollout import RolloutConfig
    from services.rollout.backend_vllm import engine_args

    llm = LLM(**engine_args(RolloutConfig(model=model, max_model_len=MAX_LEN)))
    params = [
        SamplingParams(n=args.n, temperature=1.0, max_tokens=args.max_new_tokens, seed=i, logprobs=0)
        for i in range(len(prompts))
    ]
    rates = []
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        if i:
            rates.append(sum(len(c.token_ids) for o in outs for c in o.outputs) / (time.perf_counter() - t0))
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    return statistics.median(rates)


def generation(tmp: pathlib.Path, args) -> None:
    prompts = prompt_ids(args.prompts)
    print(
        f"\n(a) generation: {args.prompts} prompts x n={args.n}, up to {args.max_new_tokens} new tokens, "
        f"temperature 1; generated tokens/s, median of {args.repeats}\n"
    )
    print(
        "| model | vLLM in process | vLLM service | service / in process | HF service | vLLM / HF |\n"
        "|---|---|---|---|---|---|"
    )
    for name, cfg in GEN_MODELS.items():
        model = str(make_model(tmp / name, cfg))
        local = in_process_rate(model, prompts, args, args.repeats)
        rates = {}
        for backend in ("vllm", "hf"):
            proc, client = start_service(model, backend)
            try:
                rates[backend] = service_rate(client, prompts, args, args.repeats)
            finally:
                proc.terminate()
                proc.wait()
        print(
            f"| {name} | {local:,.0f} | {rates['vllm']:,.0f} | {rates['vllm'] / local:.2f} | "
            f"{rates['hf']:,.0f} | {rates['vllm'] / rates['hf']:.2f} |",
            flush=True,
        )


def handoff(tmp: pathlib.Path, args) -> None:
    print(
        f"\n(b) weight handoff into a running engine (end to end: Begin, copy or send, Finish with the "
        f"engine's reload), median of {args.repeats}; GB/s of parameter bytes\n"
    )
    print(
        "| model | rollout | bytes | np.copy | shm | shm / np.copy | stream | stream / np.copy | shm transfer only "
        "| stream transfer only | engine reload | shm push |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    for name in args.models.split(","):
        for backend in args.backends.split(","):
            handoff_one(tmp, name, backend, args)


def handoff_one(tmp: pathlib.Path, name: str, backend: str, args) -> None:
    model = tmp / name.strip("~ ")
    if not (model / "config.json").is_file():
        make_model(model, SYNC_MODELS[name])
    named = load_file(model / "model.safetensors")
    size = sum(weights.nbytes(t) for t in named.values())
    flat = np.concatenate([t.view(torch.uint8).numpy().ravel() for t in named.values()])
    copies = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        np.copy(flat)
        copies.append(time.perf_counter() - t0)
    proc, client = start_service(str(model), backend)
    version, speeds = 0, {}
    try:
        for transport in ("shm", "stream"):
            runs = []
            for i in range(args.repeats + 1):  # the first grows the staging segment
                version += 1
                stats = weights.push_state(client, named, version, transport)
                if i:
                    runs.append(stats)
            speeds[transport] = size / statistics.median(r["seconds"] for r in runs) / 1e9
            speeds[transport + "_transfer"] = size / statistics.median(r["transfer_seconds"] for r in runs) / 1e9
            speeds["reload_ms"] = statistics.median(r["load_seconds"] for r in runs) * 1e3
    finally:
        proc.terminate()
        proc.wait()
    base = size / statistics.median(copies) / 1e9
    print(
        f"| {name} | {backend} | {size / 2**20:,.0f} MiB | {base:.2f} | {speeds['shm']:.2f} | "
        f"{speeds['shm'] / base:.2f} | {speeds['stream']:.2f} | {speeds['stream'] / base:.2f} | "
        f"{speeds['shm_transfer']:.2f} | {speeds['stream_transfer']:.2f} | {speeds['reload_ms']:,.0f} ms | "
        f"{size / speeds['shm'] / 1e9:.2f} s |",
        flush=True,
    )


def reload_profile(tmp: pathlib.Path, args) -> None:
    """vLLM's in-place reload (what a push's load runs in the engine), in this process: its time, and where
    it goes (cProfile, cumulative)."""
    import cProfile
    import pstats

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM

    name = args.models.split(",")[0]
    model = make_model(tmp / name.strip("~ "), SYNC_MODELS[name])
    llm = LLM(model=str(model), dtype="float32", max_model_len=MAX_LEN, enforce_eager=True)
    named = list(load_file(model / "model.safetensors").items())
    runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
    runs = []
    for _ in range(args.repeats + 1):
        t0 = time.perf_counter()
        runner.reload_weights(weights_iterator=iter(named))
        runs.append(time.perf_counter() - t0)
    print(
        f"\n(c) vLLM's in-place reload of {name}: {statistics.median(runs[1:]) * 1e3:.0f} ms (median of {args.repeats})"
    )
    profile = cProfile.Profile()
    profile.runcall(runner.reload_weights, weights_iterator=iter(named))
    pstats.Stats(profile).sort_stats("tottime").print_stats(8)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--parts", default="generation,handoff")
    ap.add_argument("--models", default="~125 MB,~500 MB", help=f"handoff: of {', '.join(SYNC_MODELS)}")
    ap.add_argument("--backends", default="vllm", help="handoff: the rollout backends pushed into (vllm,hf)")
    args = ap.parse_args()
    tmp = pathlib.Path(tempfile.mkdtemp())
    if "generation" in args.parts:
        generation(tmp, args)
    if "handoff" in args.parts:
        handoff(tmp, args)
    if "reload" in args.parts:
        reload_profile(tmp, args)


if __name__ == "__main__":
    main()
