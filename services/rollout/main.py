"""`meshrl serve rollout`: a vLLM (or HF) engine behind the RolloutService, until SIGTERM.

meshrl serve rollout --model models/tiny-lm --backend vllm --max-model-len 512
"""

import argparse
import os

from meshrl.config.rollout import RolloutConfig
from meshrl.flags import add_dataclass_flags, add_server_flags, dataclass_from_args
from meshrl.hosts import parse_cpus
from meshrl.rpc.server import run_service
from services.rollout.servicer import RolloutServicer


def take_cores(cores: list[int], workers: int) -> None:
    """Run on these cores only: this process and its children (vLLM's engine), torch's thread pool, and
    vLLM's CPU worker threads (VLLM_CPU_OMP_THREADS_BIND, the cores cut over its tensor-parallel workers)."""
    import torch

    os.sched_setaffinity(0, cores)
    torch.set_num_threads(max(1, len(cores) // workers))
    per = [cores[i * len(cores) // workers : (i + 1) * len(cores) // workers] or cores[:1] for i in range(workers)]
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(",".join(map(str, c)) for c in per)
    os.environ["OMP_NUM_THREADS"] = str(max(1, len(cores) // workers))


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="meshrl serve rollout", description=__doc__.splitlines()[0])
    add_server_flags(p)
    add_dataclass_flags(p, RolloutConfig)
    args = p.parse_args(argv)
    if not args.model:
        p.error("--model is required")
    cfg = dataclass_from_args(RolloutConfig, args)
    if cfg.cpus:
        take_cores(parse_cpus(cfg.cpus), cfg.tensor_parallel_size)
    return run_service(RolloutServicer(cfg), args, f"rollout service ({cfg.backend})")
