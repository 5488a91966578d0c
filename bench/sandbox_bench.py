"""Sandboxes (services/sandbox): what running a program in one costs over running it directly, and how many
graded samples a second the service sustains.

    .venv/bin/python bench/sandbox_bench.py [--calls 200] [--threads 4]

Measured, each in the same run: `python3 -c PROGRAM` started directly (subprocess), in a bubblewrap
sandbox (services/sandbox/bwrap.run in a slot of the service, its own user id: every Run is a new
sandbox, so there is no cold or warm start to tell apart), the same without its cgroup (where the machine
gives the service cgroups: what the group per Run costs), and through the SandboxService over gRPC on
127.0.0.1 one call at a time (p50, p99 and the p50 over direct); then `--threads` clients calling Run at
once: sandboxes a second.
"""

import argparse
import concurrent.futures
import statistics
import subprocess
import time

from meshrl.config.sandbox import SandboxConfig
from meshrl.rpc import Client, Server
from meshrl.v1 import sandbox_pb2
from services.sandbox.servicer import SandboxServicer

PROGRAM = "def f(x):\n    return x * 2\nassert f(3) == 6\n"  # a trivial graded sample


def times(call, n: int) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        out.append((time.perf_counter() - start) * 1000)
    return sorted(out)


def row(name: str, ms: list[float], base: float | None = None) -> str:
    p50, p99 = statistics.median(ms), ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    extra = f" | +{p50 - base:.1f}" if base is not None else " | -"
    return f"| {name} | {p50:.1f} | {p99:.1f}{extra} |"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--threads", type=int, default=4)
    args = p.parse_args()
    cfg = SandboxConfig(concurrency=args.threads)
    servicer = SandboxServicer(cfg)
    limits = servicer.limits(sandbox_pb2.Limits())
    direct = times(lambda: subprocess.run(["/usr/bin/python3", "-c", PROGRAM], check=True), args.calls)
    boxed = times(lambda: servicer._in_slot(["python3", "-c", PROGRAM], {}, b"", limits, False), args.calls)
    place, servicer.cgroups = servicer.cgroups, None
    bare = times(lambda: servicer._in_slot(["python3", "-c", PROGRAM], {}, b"", limits, False), args.calls)
    servicer.cgroups = place
    server = Server([servicer], max_workers=args.threads * 2).start()
    client = Client(server.address, SandboxServicer.SERVICE, timeout=60, retries=0)
    request = sandbox_pb2.RunRequest(argv=["python3", "main.py"], files={"main.py": PROGRAM.encode()})
    served = times(lambda: client.call("Run", request), args.calls)
    start = time.perf_counter()

    def code(_) -> int:
        reply = client.call("Run", request)
        assert isinstance(reply, sandbox_pb2.RunResponse)
        return reply.exit_code

    with concurrent.futures.ThreadPoolExecutor(args.threads) as pool:
        codes = list(pool.map(code, range(args.calls)))
    rate = args.calls / (time.perf_counter() - start)
    server.stop(0)
    assert codes == [0] * args.calls, codes
    base = statistics.median(direct)
    print("| how | p50 ms | p99 ms | p50 over direct |\n|---|---|---|---|")
    print(row("direct (subprocess)", direct))
    print(row(f"bubblewrap sandbox (cgroups: {place.kind if place else 'none'})", boxed, base))
    if place is not None:
        print(row("bubblewrap sandbox without its cgroup", bare, base))
    print(row("SandboxService.Run over gRPC", served, base))
    print(f"\n{rate:.0f} graded samples/s with {args.threads} clients ({args.calls} Runs, all passed)")


if __name__ == "__main__":
    main()
