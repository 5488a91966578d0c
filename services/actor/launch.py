"""Starting and joining the actor service's process group.

Rank 0 is the `meshrl serve actor` process itself; it starts ranks 1..N-1 as
child processes (`python -m services.actor.rank`) with torchrun-style
environment variables. The group uses gloo for CPU tensors and, where CUDA is
present, NCCL for GPU tensors, one device per rank.
"""

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import torch
import torch.distributed as dist

from meshrl.lifeline import child_env


def new_store() -> str:
    """Where the ranks meet: a file in a folder only this user may enter. torch's TCP store (MASTER_PORT)
    would listen on every interface and let anyone who reaches it into the group."""
    return str(pathlib.Path(tempfile.mkdtemp(prefix="meshrl-group-")) / "store")


def rank_env(rank: int, world_size: int, store: str) -> dict[str, str]:
    """A rank's environment: its place, the rendezvous file, and the loopback interface for gloo's and
    NCCL's own sockets (a service's ranks share one host)."""
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "MESHRL_GROUP_STORE": store,
        "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
        "NCCL_SOCKET_IFNAME": os.environ.get("NCCL_SOCKET_IFNAME", "lo"),
    }


def start_ranks(role: str, world_size: int, store: str, threads: int) -> list[subprocess.Popen]:
    """Ranks 1..N-1; OMP_NUM_THREADS sizes their torch thread pools before torch starts them."""
    return [
        subprocess.Popen(
            [sys.executable, "-m", "services.actor.rank", role],
            env=child_env({**os.environ, **rank_env(r, world_size, store), "OMP_NUM_THREADS": str(threads)}),
        )
        for r in range(1, world_size)
    ]


def join_group() -> None:
    """init_process_group from the environment (rank_env); picks the GPU of this rank where there is one."""
    init_method = f"file://{os.environ['MESHRL_GROUP_STORE']}"
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
        backend = "cpu:gloo,cuda:nccl"
    else:
        backend = "gloo"
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size)


def leave_group(store: str) -> None:
    dist.destroy_process_group()
    shutil.rmtree(pathlib.Path(store).parent, ignore_errors=True)
