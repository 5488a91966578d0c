"""Starting and joining the actor service's process group.

Rank 0 is the `meshrl serve actor` process itself; it starts ranks 1..N-1 as
child processes (`python -m services.actor.rank`) with torchrun-style
environment variables. The group uses gloo for CPU tensors and, where CUDA is
present, NCCL for GPU tensors, one device per rank.

On one host the ranks meet in a file only this user may open. A group across
nodes (`--local-ranks K` < world size: rank 0 starts ranks 1..K-1, the others
are started on their nodes, e.g. by `meshrl ray`) meets in a TCP store that
rank 0 opens on its node's address (`--group-port`). torch's store has no
authentication, so every key in it carries the run's secret as a prefix
(MESHRL_GROUP_SECRET, never on a command line): a process that reaches the
port but lacks the secret finds none of the group's keys and cannot join.
gloo's and NCCL's own sockets use the interface that carries each rank's node
address.
"""

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import torch
import torch.distributed as dist

from meshrl.group import GROUP_ADDR_VAR, GROUP_SECRET_VAR, STORE_TIMEOUT, node_env
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


def start_ranks(
    role: str, world_size: int, store: str, threads: int, local: int | None = None
) -> list[subprocess.Popen]:
    """Ranks 1..local-1 (default: all N-1) here; OMP_NUM_THREADS sizes their torch thread pools before
    torch starts them. In a group across nodes (MESHRL_GROUP_ADDR set) they join rank 0's TCP store."""
    group = os.environ.get(GROUP_ADDR_VAR)

    def env(r: int) -> dict[str, str]:
        if group:
            host = group.rpartition(":")[0]
            return node_env(r, r, world_size, group, os.environ[GROUP_SECRET_VAR], host)
        return rank_env(r, world_size, store)

    return [
        subprocess.Popen(
            [sys.executable, "-m", "services.actor.rank", role],
            env=child_env({**os.environ, **env(r), "OMP_NUM_THREADS": str(threads)}),
        )
        for r in range(1, world_size if local is None else local)
    ]


def join_group() -> None:
    """init_process_group from the environment (rank_env, or node_env across nodes); picks the GPU of this
    rank where there is one."""
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
        backend = "cpu:gloo,cuda:nccl"
    else:
        backend = "gloo"
    group = os.environ.get(GROUP_ADDR_VAR)
    if not group:
        init_method = f"file://{os.environ['MESHRL_GROUP_STORE']}"
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size)
        return
    host, _, port = group.rpartition(":")
    store = dist.TCPStore(host, int(port), world_size, is_master=rank == 0, timeout=STORE_TIMEOUT)
    secret = dist.PrefixStore(os.environ[GROUP_SECRET_VAR], store)
    dist.init_process_group(backend, store=secret, rank=rank, world_size=world_size)


def leave_group(store: str | None) -> None:
    dist.destroy_process_group()
    if store:
        shutil.rmtree(pathlib.Path(store).parent, ignore_errors=True)
