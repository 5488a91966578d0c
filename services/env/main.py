"""`meshrl serve env`: Python environments behind the EnvService, until SIGTERM.

meshrl serve env --module services.env.calculator:Calculator
meshrl serve env --module path/to/my_env.py:MyEnv --step-timeout 10
"""

import argparse

from meshrl.config.env import EnvConfig
from meshrl.flags import add_dataclass_flags, add_server_flags, dataclass_from_args
from meshrl.rpc.server import run_service
from services.env.servicer import EnvServicer


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="meshrl serve env", description=__doc__.splitlines()[0])
    add_server_flags(p)
    add_dataclass_flags(p, EnvConfig)
    args = p.parse_args(argv)
    cfg = dataclass_from_args(EnvConfig, args)
    servicer = EnvServicer(cfg)
    return run_service(servicer, args, f"env service ({cfg.module})", max_workers=cfg.workers)
