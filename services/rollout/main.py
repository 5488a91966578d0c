"""`meshrl serve rollout`: a vLLM (or HF) engine behind the RolloutService, until SIGTERM.

    meshrl serve rollout --model models/tiny-lm --backend vllm --max-model-len 512
"""

import argparse
import dataclasses

from meshrl.rpc import Server
from services.rollout.config import RolloutConfig
from services.rollout.servicer import RolloutServicer


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="meshrl serve rollout", description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--token", default=None)
    for f in dataclasses.fields(RolloutConfig):
        p.add_argument(f"--{f.name.replace('_', '-')}", type=f.type if f.type in (int, float) else str,
                       default=f.default, required=f.name == "model")
    args = p.parse_args(argv)
    cfg = RolloutConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(RolloutConfig)})
    servicer = RolloutServicer(cfg)
    server = Server([servicer], host=args.host, port=args.port, token=args.token).start()
    print(f"rollout service ({cfg.backend}) listening on {server.address}", flush=True)
    try:
        server.run_until_signal()
    finally:
        servicer.close()
    return 0
