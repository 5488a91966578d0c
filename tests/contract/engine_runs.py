"""Runs of engine_ranks.py on a gloo group of its own (one process per rank, as torchrun starts them),
and what they leave: the log-probs, the step's statistics, the weights after it and what a push sends."""

import json
import os
import pathlib
import socket
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

HELPER = pathlib.Path(__file__).parent / "engine_ranks.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(world: int, engine: str, model, out: pathlib.Path, *flags: str) -> dict:
    launch(world, engine, model, out, *flags)
    result = {"logprobs": load_file(out / "logprobs.safetensors")["logprobs"]}
    if (out / "stats.json").exists():
        result["stats"] = json.loads((out / "stats.json").read_text())
        result["weights"] = load_file(out / "weights.safetensors")
        result["pushed"] = load_file(out / "pushed.safetensors")
        if (out / "shared.json").exists():
            result["shared"] = json.loads((out / "shared.json").read_text())
        if (out / "merged.safetensors").exists():  # a LoRA run (test_engines_lora.py)
            result["merged"] = load_file(out / "merged.safetensors")
            result["base_logprobs"] = load_file(out / "base_logprobs.safetensors")["logprobs"]
    return result


def launch(world: int, engine: str, model, out: pathlib.Path, *flags: str) -> None:
    if torch.cuda.is_available() and world > torch.cuda.device_count():
        pytest.skip(f"{world} NCCL ranks need {world} GPUs; this machine has {torch.cuda.device_count()}")
    out.mkdir(parents=True, exist_ok=True)
    port = str(free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, str(HELPER), engine, str(model), str(out), *flags],
            env={
                **os.environ,
                "RANK": str(r),
                "WORLD_SIZE": str(world),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": port,
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(world)
    ]
    logs = [p.communicate(timeout=300)[0] for p in procs]
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
