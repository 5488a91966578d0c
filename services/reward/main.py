"""`meshrl serve reward`: start the reward service and serve until SIGTERM."""

import argparse

from meshrl.config.reward import RewardConfig
from meshrl.flags import add_dataclass_flags, add_server_flags, dataclass_from_args
from meshrl.rpc.server import run_service
from services.reward.servicer import RewardServicer


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="meshrl serve reward", description="the reward service")
    add_server_flags(p)
    add_dataclass_flags(p, RewardConfig)
    args = p.parse_args(argv)
    cfg = dataclass_from_args(RewardConfig, args)
    return run_service(RewardServicer(cfg), args, f"reward service ({cfg.backend})")
