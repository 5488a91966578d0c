"""`meshrl serve rollout`: a vLLM (or HF) engine behind the RolloutService, until SIGTERM.

meshrl serve rollout --model models/tiny-lm --backend vllm --max-model-len 512
"""

import argparse

from meshrl.config.rollout import RolloutConfig
from meshrl.flags import add_dataclass_flags, add_server_flags, dataclass_from_args
from meshrl.rpc.server import run_service
from services.rollout.servicer import RolloutServicer


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="meshrl serve rollout", description=__doc__.splitlines()[0])
    add_server_flags(p)
    add_dataclass_flags(p, RolloutConfig)
    args = p.parse_args(argv)
    if not args.model:
        p.error("--model is required")
    cfg = dataclass_from_args(RolloutConfig, args)
    return run_service(RolloutServicer(cfg), args, f"rollout service ({cfg.backend})")
