"""What this machine offers the services: CPU cores, GPUs, what `world_size=auto` and `threads=0` mean, and
what a service address looks like.

On a GPU machine a training role gets one rank per visible GPU. On CPU it gets
one rank with every core as its threads: ranks on one host share its memory, so
sharding over them saves none, and on this project's 2-core machine one rank x 2
threads ran the main job's step in 0.88x the time of FSDP2 on 2 ranks
(bench/step_bench.py --compare world, bench/RESULTS.md).
"""

import os

AUTO = "auto"


def cores() -> int:
    """CPU cores this process may run on (its affinity, not the machine's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def gpus() -> int:
    """Visible CUDA devices; 0 without CUDA (torch is imported only to ask)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def world_size(value: int | str, key: str = "world_size") -> int:
    """Ranks for a world size setting: an int >= 1 as it is; "auto": one per GPU, or 1 on CPU."""
    if value == AUTO:
        return gpus() or 1
    if isinstance(value, str) and value.strip().isdigit():  # from a command line
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key}={value!r} must be a number of ranks >= 1 or {AUTO!r}")
    return value


def threads_per_rank(threads: int, ranks: int) -> int:
    """Torch threads for each rank: `threads`, or where it is 0 the cores shared out over the ranks, so
    that ranks x threads never exceeds the cores (oversubscribed ranks spin against each other)."""
    return threads if threads > 0 else max(1, cores() // ranks)


def parse_cpus(text: str) -> list[int]:
    """Core ids from a list such as "0-3,6" (ValueError for anything else)."""
    out: list[int] = []
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        if not lo.isdigit() or dash and not hi.isdigit():
            raise ValueError(f"cpus={text!r} must be core ids and ranges such as 0-3,6")
        out += range(int(lo), int(hi) + 1) if dash else [int(lo)]
    return sorted(set(out))


def share_cores(parts: int) -> list[str]:
    """This process's cores cut into `parts` near-equal disjoint sets, as core lists ("0", "1-2", ...); with
    more parts than cores, parts share them round robin (one core each)."""
    mine = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(cores()))
    if parts >= len(mine):
        return [str(mine[i % len(mine)]) for i in range(parts)]
    bounds = [i * len(mine) // parts for i in range(parts + 1)]
    return [",".join(map(str, mine[a:b])) for a, b in zip(bounds, bounds[1:])]


def address_list(text: str) -> list[str]:
    """The addresses of a comma-separated list (a rollout fleet's: "H1:P1,H2:P2"), blanks left out."""
    return [a.strip() for a in text.split(",") if a.strip()]


def host_of(address: str) -> str:
    """The host part of HOST:PORT."""
    return address.rpartition(":")[0]


def is_address(text: str) -> bool:
    """HOST:PORT with a port a socket can have (grpc would dial port 443 for a bare host, and 70000 as 4464)."""
    host, sep, port = text.rpartition(":")
    return bool(sep and host and port.isdigit() and 1 <= int(port) <= 65535)
