"""`meshrl serve reward`: start the reward service and serve until SIGTERM."""

import argparse
import dataclasses
import logging

from meshrl.rpc import Server
from services.reward.config import RewardConfig
from services.reward.servicer import RewardServicer

log = logging.getLogger(__name__)


def parse_args(argv: list[str]) -> tuple[RewardConfig, argparse.Namespace]:
    p = argparse.ArgumentParser(prog="meshrl serve reward", description="the reward service")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0: any free port (printed)")
    p.add_argument("--token", default=None, help="require this bearer token")
    for f in dataclasses.fields(RewardConfig):
        flag = f"--{f.name.replace('_', '-')}"
        if f.type is bool:
            p.add_argument(flag, action="store_true")
        else:
            p.add_argument(flag, type=f.type if f.type in (int, float) else str, default=f.default)
    args = p.parse_args(argv)
    cfg = RewardConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(RewardConfig)})
    return cfg, args


def main(argv: list[str]) -> int:
    cfg, args = parse_args(argv)
    servicer = RewardServicer(cfg)
    server = Server([servicer], host=args.host, port=args.port, token=args.token).start()
    print(f"reward service ({cfg.backend}) listening on {server.address}", flush=True)
    try:
        server.run_until_signal()
    finally:
        servicer.close()
    return 0
