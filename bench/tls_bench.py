"""What mutual TLS costs: the 64 MiB DataProto of bench/codec_bench.py sent to an echo service
process and back, over plain TCP and over TLS (`meshrl certs`, MESHRL_TLS_DIR), on loopback.

    .venv/bin/python bench/tls_bench.py [--rounds 3] [--repeats 5]

Plain and TLS alternate, `rounds` times each (the machine is shared and noisy); each round is the
median of `repeats` round trips after 2 warm-ups. Prints a markdown table for bench/RESULTS.md:
GB/s per direction and TLS as a share of plain. Goal (issue 13): TLS costs < 10% of the throughput.
"""

import argparse
import os
import pathlib
import statistics
import sys
import tempfile

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from codec_bench import SERVICE, batch, start_server, timed  # noqa: E402

from meshrl import tls  # noqa: E402
from meshrl.codec import Payload  # noqa: E402
from meshrl.rpc import Client  # noqa: E402
from meshrl.v1 import reward_pb2  # noqa: E402


def one_round(req, repeats: int) -> float:
    proc, address = start_server("echo", 4)  # inherits MESHRL_TLS_DIR, or its absence
    try:
        with Client(address, SERVICE, timeout=120) as c:
            c.wait_ready(30)
            return timed(lambda: c.call("Score", req), repeats) / 2  # per direction
    finally:
        proc.terminate()
        proc.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    certs = pathlib.Path(tempfile.mkdtemp()) / "certs"
    tls.make_certs(certs, [])
    data = batch()
    size = sum(t.numel() * t.element_size() for t in data.batch.values())
    req = Payload(reward_pb2.ScoreRequest(), data)
    seconds: dict[str, list[float]] = {"plain TCP": [], "mutual TLS": []}
    for _ in range(args.rounds):
        for mode in seconds:
            if mode == "mutual TLS":
                os.environ[tls.VAR] = str(certs)
            else:
                os.environ.pop(tls.VAR, None)
            seconds[mode].append(one_round(req, args.repeats))
    os.environ.pop(tls.VAR, None)
    print(
        f"DataProto of {size / 2**20:.0f} MiB echoed by a service process, {args.rounds} alternating rounds "
        f"x median of {args.repeats}, torch {torch.__version__}\n"
    )
    print("| transport | GB/s per direction (rounds) | median | x plain |\n|---|---|---|---|")
    plain = size / statistics.median(seconds["plain TCP"]) / 1e9
    for mode, times in seconds.items():
        gbs = [size / s / 1e9 for s in times]
        med = size / statistics.median(times) / 1e9
        print(f"| {mode} | {', '.join(f'{g:.2f}' for g in gbs)} | {med:.2f} | {med / plain:.2f} |")


if __name__ == "__main__":
    main()
