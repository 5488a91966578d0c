"""Overload benchmark: goodput of a service past its work limit, refusing at once vs queueing briefly and
retrying on the retry-after hint (issue 27, item 16).

A stand-in service (EchoScorer, each call sleeping --call-ms) runs in its own process with the default
limit of 16 work calls; --clients threads call it in a loop for --seconds through meshrl.rpc.Client.
Two modes, same run:
  refuse: the old behaviour (queue=0 on the server, busy_retries=0 on the clients);
  queue:  a queue of 16 waiting at most 1.5 s, clients retrying with jittered backoff on the hint.

    .venv/bin/python bench/overload_bench.py [--clients 100] [--seconds 10] [--call-ms 40]
    .venv/bin/python bench/overload_bench.py --clients 16,100 --queue 128 --wait 5 --busy-retries 0

The second form runs one server setting (a queue of --queue calls waiting up to --wait s) against each
number of clients, each retrying busy refusals --busy-retries times (0: every refusal counts, as a plain
gRPC client sees it).

Prints one line per mode: successful calls/s, refusals seen by callers, and p50/p99 latency of successes.
"""

import argparse
import pathlib
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from meshrl.codec import Payload  # noqa: E402
from meshrl.dataproto import DataProto  # noqa: E402
from meshrl.errors import ServiceError  # noqa: E402
from meshrl.rpc import Client, serve  # noqa: E402
from meshrl.v1 import reward_pb2  # noqa: E402
from testkit.echo import SERVICE, EchoScorer  # noqa: E402


def run_server(queue: int, port_file: str, wait: float) -> None:
    server = serve(EchoScorer(), max_workers=16, queue=queue, queue_wait=wait)
    pathlib.Path(port_file).write_text(str(server.port))
    server.run_until_signal(grace=0)


def start_server(queue: int, wait: float = 1.5) -> tuple[subprocess.Popen, str]:
    port_file = pathlib.Path(tempfile.mkdtemp()) / "port"
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(queue), "--wait", str(wait), "--port-file", str(port_file)]
    )
    while not (port_file.exists() and port_file.read_text()):
        if proc.poll() is not None:
            raise RuntimeError("benchmark server died")
        time.sleep(0.05)
    return proc, f"127.0.0.1:{port_file.read_text()}"


def load(address: str, clients: int, seconds: float, call_ms: float, busy_retries: int) -> dict:
    batch = DataProto({"x": torch.ones(1, 2)}, meta_info={"sleep": call_ms / 1000})
    request = Payload(reward_pb2.ScoreRequest(), batch)
    latencies, refused, lock = [], [0], threading.Lock()
    stop = time.monotonic() + seconds

    def work():
        with Client(address, SERVICE, timeout=30, busy_retries=busy_retries) as c:
            while time.monotonic() < stop:
                t0 = time.monotonic()
                try:
                    c.call("Score", request)
                    with lock:
                        latencies.append(time.monotonic() - t0)
                except ServiceError:
                    with lock:
                        refused[0] += 1

    threads = [threading.Thread(target=work) for _ in range(clients)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    q = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [float("nan")] * 99
    return {
        "ok_per_s": len(latencies) / elapsed,
        "refused": refused[0],
        "ok": len(latencies),
        "p50_ms": 1000 * q[49],
        "p99_ms": 1000 * q[98],
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--clients", default="100", help="client threads; several: 16,100")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--call-ms", type=float, default=40.0)
    p.add_argument("--queue", type=int, default=None, help="one server setting: calls that may wait")
    p.add_argument("--wait", type=float, default=1.5, help="seconds a call may wait in the queue")
    p.add_argument("--busy-retries", type=int, default=10)
    p.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--port-file", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve is not None:
        return run_server(args.serve, args.port_file, args.wait)
    runs = (
        [
            (f"queue {args.queue}, wait {args.wait} s", args.queue, args.busy_retries, int(c))
            for c in args.clients.split(",")
        ]
        if args.queue is not None
        else [("refuse", 0, 0, int(args.clients)), ("queue", 16, 10, int(args.clients))]
    )
    for mode, queue, busy_retries, clients in runs:
        proc, address = start_server(queue, args.wait)
        try:
            r = load(address, clients, args.seconds, args.call_ms, busy_retries)
        finally:
            proc.terminate()
            proc.wait(30)
        share = r["refused"] / max(1, r["refused"] + r["ok"])
        print(
            f"{mode}, {clients} clients: {r['ok_per_s']:.0f} ok calls/s, {r['refused']} refused ({share:.1%}), "
            f"latency of successes p50 {r['p50_ms']:.0f} ms, p99 {r['p99_ms']:.0f} ms",
            flush=True,
        )


if __name__ == "__main__":
    main()
