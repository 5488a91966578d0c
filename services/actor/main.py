"""`meshrl serve actor`: start N ranks, serve the ActorService from rank 0 until SIGTERM.

    meshrl serve actor --role actor --model models/tiny-lm --world-size 2 --lr 1e-5

With --model the service initializes itself (engine and optimizer flags below);
without it, the orchestrator sends Init.
"""

import argparse
import logging
import os

import torch

from meshrl import hosts
from meshrl.config.actor import EngineConfig, OptimConfig
from meshrl.flags import add_dataclass_flags, add_server_flags
from meshrl.group import GROUP_SECRET_VAR, free_port, node_env
from meshrl.rpc.server import run_service
from services.actor.comm import Driver
from services.actor.handler import RankHandler
from services.actor.launch import join_group, leave_group, new_store, rank_env, start_ranks
from services.actor.roles import ROLES
from services.actor.servicer import ActorServicer, check_init

log = logging.getLogger(__name__)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="meshrl serve actor", description=__doc__.splitlines()[0])
    p.add_argument("--role", choices=sorted(ROLES), default="actor")
    p.add_argument("--model", default=None, help="HF folder; given, the service initializes itself")
    p.add_argument("--world-size", default="1", help="ranks; auto: one per visible GPU, or 1 on CPU")
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads per rank; 0: the cores this process may use divided by --world-size",
    )
    p.add_argument(
        "--checkpoint-root",
        default=".",
        help="SaveCheckpoint and LoadCheckpoint paths must lie under this folder (default: the working "
        "directory); relative paths are taken from it",
    )
    p.add_argument(
        "--local-ranks",
        type=int,
        default=0,
        help="ranks this process starts here (0: all); fewer: the group spans nodes, the other ranks are "
        "started on theirs (`python -m services.actor.rank ROLE` with node_env), and they meet in a TCP store "
        "on --host at --group-port, each key behind MESHRL_GROUP_SECRET",
    )
    p.add_argument(
        "--group-port", type=int, default=0, help="the group's TCP store (with --local-ranks); 0: a free one"
    )
    add_server_flags(p)
    engine_keys = add_dataclass_flags(p, EngineConfig)
    optim_keys = add_dataclass_flags(p, OptimConfig, skip=("betas",))
    args = p.parse_args(argv)
    try:
        args.world_size = hosts.world_size(args.world_size, "--world-size")
    except ValueError as e:
        p.error(str(e))
    if args.threads < 0:
        p.error("--threads must be >= 0")
    local = args.local_ranks or args.world_size  # the ranks on this machine
    if not 1 <= local <= args.world_size:
        p.error(f"--local-ranks must be in 1..--world-size ({args.world_size}), got {args.local_ranks}")
    gpus = hosts.gpus()
    if gpus and local > gpus:  # NCCL would refuse two ranks on one device, but only at the first call
        p.error(
            f"--world-size {args.world_size} puts {local} ranks on this machine's {gpus} GPU(s), and "
            f"NCCL refuses two ranks on one device: use --world-size auto (one per GPU) or at most {gpus}"
        )

    engine = {k: getattr(args, k) for k in engine_keys}
    optim = {k: getattr(args, k) for k in optim_keys}
    if args.model:
        try:  # one line for settings the ranks would fail on, before any rank starts
            check_init(args.role, args.model, engine, optim)
        except ValueError as e:
            p.error(str(e))

    store = None
    if local < args.world_size:  # a group across nodes: rank 0's TCP store on this node's address
        if not os.environ.get(GROUP_SECRET_VAR):
            p.error(f"--local-ranks below --world-size needs {GROUP_SECRET_VAR} in the environment")
        group = f"{args.host}:{args.group_port or free_port(args.host)}"
        os.environ.update(node_env(0, 0, args.world_size, group, os.environ[GROUP_SECRET_VAR], args.host))
        log.info("the group's store is at %s: ranks %d..%d join it from their nodes", group, local, args.world_size - 1)
    else:
        store = new_store()
        os.environ.update(rank_env(0, args.world_size, store))
    threads = hosts.threads_per_rank(args.threads, local)
    torch.set_num_threads(threads)
    children = start_ranks(args.role, args.world_size, store or "", threads, local)
    join_group()
    driver = Driver(RankHandler(args.role))
    servicer = ActorServicer(args.role, driver, args.checkpoint_root)
    if args.model:
        servicer.init(servicer.init_args_from(args.model, engine, optim))
    try:
        return run_service(servicer, args, f"actor service ({args.role}, {args.world_size} ranks x {threads} threads)")
    finally:
        driver.stop()
        for c in children:
            c.wait(timeout=60)
        leave_group(store)
