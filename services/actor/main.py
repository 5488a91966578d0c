"""`meshrl serve actor`: start N ranks, serve the ActorService from rank 0 until SIGTERM.

    meshrl serve actor --role actor --model models/tiny-lm --world-size 2 --lr 1e-5

With --model the service initializes itself (engine and optimizer flags below);
without it, the orchestrator sends Init.
"""

import argparse
import dataclasses
import logging
import os

import torch.distributed as dist

from meshrl.rpc import Server
from services.actor.comm import Driver
from services.actor.config import EngineConfig, OptimConfig
from services.actor.handler import RankHandler
from services.actor.launch import free_port, join_group, rank_env, start_ranks
from services.actor.roles import ROLES
from services.actor.servicer import ActorServicer

log = logging.getLogger(__name__)


def _add_fields(p: argparse.ArgumentParser, cls) -> list[str]:
    names = []
    for f in dataclasses.fields(cls):
        if f.name == "betas":
            continue
        flag = f"--{f.name.replace('_', '-')}"
        if f.type is bool:
            p.add_argument(flag, action="store_true")
        else:
            p.add_argument(flag, type=f.type if f.type in (int, float) else str, default=f.default)
        names.append(f.name)
    return names


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="meshrl serve actor", description=__doc__.splitlines()[0])
    p.add_argument("--role", choices=sorted(ROLES), default="actor")
    p.add_argument("--model", default=None, help="HF folder; given, the service initializes itself")
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--token", default=None)
    engine_keys = _add_fields(p, EngineConfig)
    optim_keys = _add_fields(p, OptimConfig)
    args = p.parse_args(argv)
    if args.world_size < 1:
        p.error("--world-size must be >= 1")
    if args.world_size == 1 and args.engine == "fsdp2" and "--engine" not in argv:
        pass  # fsdp2 on one rank is valid; the plain engine is only a debugging choice

    port = free_port()
    os.environ.update(rank_env(0, args.world_size, port))
    children = start_ranks(args.role, args.world_size, port)
    join_group()
    driver = Driver(RankHandler(args.role))
    servicer = ActorServicer(args.role, driver)
    if args.model:
        servicer.init(servicer.init_args_from(args.model, {k: getattr(args, k) for k in engine_keys},
                                              {k: getattr(args, k) for k in optim_keys}))
    server = Server([servicer], host=args.host, port=args.port, token=args.token).start()
    print(f"actor service ({args.role}, {args.world_size} ranks) listening on {server.address}", flush=True)
    try:
        server.run_until_signal()
    finally:
        driver.stop()
        for c in children:
            c.wait(timeout=60)
        dist.destroy_process_group()
    return 0
