"""How the ranks of a trained service meet when they span nodes: rank 0 opens a TCP store on its node's
address, every key behind the run's secret (torch's store has no authentication: a process that reaches
the port but lacks the secret finds none of the group's keys), and each rank's gloo and NCCL sockets use
the interface that carries its own node's address. services/actor/launch.py joins such a group;
`meshrl ray` starts the ranks on their nodes (orchestrator/ray_launch.py)."""

import datetime
import ipaddress
import os
import socket

GROUP_ADDR_VAR = "MESHRL_GROUP_ADDR"  # HOST:PORT of rank 0's TCP store: a group across nodes
GROUP_SECRET_VAR = "MESHRL_GROUP_SECRET"  # the prefix of every key in it
STORE_TIMEOUT = datetime.timedelta(seconds=600)  # ranks on other nodes may start that much later


def node_env(rank: int, local_rank: int, world_size: int, group: str, secret: str, node: str) -> dict[str, str]:
    """A rank's environment in a group across nodes: its place, rank 0's store and the run's secret, and
    the interface of its node's address `node` for gloo's and NCCL's sockets."""
    interface = interface_of(node)
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(world_size),
        GROUP_ADDR_VAR: group,
        GROUP_SECRET_VAR: secret,
        "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", interface),
        "NCCL_SOCKET_IFNAME": os.environ.get("NCCL_SOCKET_IFNAME", interface),
    }


def interface_of(address: str) -> str:
    """The network interface that carries `address` (loopback: lo); ValueError when none does."""
    import psutil  # vLLM's and Ray's dependency; only a group across nodes needs it

    ip = ipaddress.ip_address(socket.gethostbyname(address))
    for name, addrs in psutil.net_if_addrs().items():
        for a in addrs:
            if (
                a.family == socket.AF_INET
                and a.netmask
                and ip in ipaddress.ip_network(f"{a.address}/{a.netmask}", False)
            ):
                return name
    raise ValueError(f"no network interface of this machine carries {address}")


def free_port(host: str) -> int:
    """A port free now on `host` (the group's store opens it right after)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
