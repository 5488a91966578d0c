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
from meshrl.config.actor import ActorServiceConfig, EngineConfig, OptimConfig
from meshrl.flags import add_dataclass_flags, add_server_flags, as_flags, dataclass_from_args
from meshrl.group import GROUP_SECRET_VAR, free_port, node_env
from meshrl.rpc.server import run_service
from services.actor.comm import Driver
from services.actor.handler import RankHandler
from services.actor.launch import join_group, leave_group, new_store, rank_env, start_ranks
from services.actor.servicer import ActorServicer, check_init

log = logging.getLogger(__name__)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="meshrl serve actor", description=__doc__.splitlines()[0])
    add_server_flags(p)
    add_dataclass_flags(p, ActorServiceConfig)
    engine_keys = add_dataclass_flags(p, EngineConfig)
    optim_keys = add_dataclass_flags(p, OptimConfig, skip=("betas",))
    args = p.parse_args(argv)
    try:
        own = dataclass_from_args(ActorServiceConfig, args)
    except ValueError as e:
        p.error(as_flags(e))
    world = own.world_size
    assert isinstance(world, int)  # RankSettings made it one
    local = own.local_ranks or world  # the ranks on this machine
    gpus = hosts.gpus()
    if gpus and local > gpus:  # NCCL would refuse two ranks on one device, but only at the first call
        p.error(
            f"--world-size {world} puts {local} ranks on this machine's {gpus} GPU(s), and "
            f"NCCL refuses two ranks on one device: use --world-size auto (one per GPU) or at most {gpus}"
        )

    engine = {k: getattr(args, k) for k in engine_keys}
    optim = {k: getattr(args, k) for k in optim_keys}
    if own.model:
        try:  # one line for settings the ranks would fail on, before any rank starts
            check_init(own.role, own.model, engine, optim)
        except ValueError as e:
            p.error(str(e))

    store = None
    if local < world:  # a group across nodes: rank 0's TCP store on this node's address
        if not os.environ.get(GROUP_SECRET_VAR):
            p.error(f"--local-ranks below --world-size needs {GROUP_SECRET_VAR} in the environment")
        group = f"{args.host}:{own.group_port or free_port(args.host)}"
        os.environ.update(node_env(0, 0, world, group, os.environ[GROUP_SECRET_VAR], args.host))
        log.info("the group's store is at %s: ranks %d..%d join it from their nodes", group, local, world - 1)
    else:
        store = new_store()
        os.environ.update(rank_env(0, world, store))
    threads = hosts.threads_per_rank(own.threads, local)
    torch.set_num_threads(threads)
    children = start_ranks(own.role, world, store or "", threads, local)
    join_group()
    driver = Driver(RankHandler(own.role))
    servicer = ActorServicer(own.role, driver, own.checkpoint_root)
    if own.model:
        servicer.init(servicer.init_args_from(own.model, engine, optim))
    try:
        return run_service(servicer, args, f"actor service ({own.role}, {world} ranks x {threads} threads)")
    finally:
        driver.stop()
        for c in children:
            c.wait(timeout=60)
        leave_group(store)
