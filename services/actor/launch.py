"""Starting and joining the actor service's process group.

Rank 0 is the `meshrl serve actor` process itself; it starts ranks 1..N-1 as
child processes (`python -m services.actor.rank`) with torchrun-style
environment variables. The group uses gloo for CPU tensors and, where CUDA is
present, NCCL for GPU tensors, one device per rank.
"""

import os
import socket
import subprocess
import sys

import torch
import torch.distributed as dist

from meshrl.lifeline import child_env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank: int, world_size: int, port: int) -> dict[str, str]:
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


def start_ranks(role: str, world_size: int, port: int, threads: int) -> list[subprocess.Popen]:
    """Ranks 1..N-1; OMP_NUM_THREADS sizes their torch thread pools before torch starts them."""
    return [subprocess.Popen([sys.executable, "-m", "services.actor.rank", role],
                             env=child_env({**os.environ, **rank_env(r, world_size, port),
                                            "OMP_NUM_THREADS": str(threads)}))
            for r in range(1, world_size)]


def join_group() -> None:
    """init_process_group from the environment; picks the GPU of this rank where there is one."""
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
        dist.init_process_group("cpu:gloo,cuda:nccl")
    else:
        dist.init_process_group("gloo")
