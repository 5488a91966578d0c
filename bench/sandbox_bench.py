"""Sandboxes (services/sandbox): what running a program in one costs over running it directly, cold and from
the warm pool, and how many graded samples a second the service sustains.

    .venv/bin/python bench/sandbox_bench.py [--calls 200] [--threads 4]

Measured, each in the same run: `python3 -c PROGRAM` started directly (subprocess); in a new bubblewrap
sandbox (cold: services/sandbox/bwrap.run in a slot of the service, its own user id), the same without its
cgroup (where the machine gives the service cgroups: what the group costs), and in a warm sandbox the pool
started ahead (each call waits, untimed, for the pool to be full again); a sandbox's start alone (the
program `true`), cold and warm; then through the SandboxService over gRPC on 127.0.0.1, one call at a time
(cold, warm) and `--threads` clients calling Run at once: sandboxes a second, with the pool off and on (its
refills then compete with the Runs for the CPU: the share of Runs that found one ready is said).
"""

import argparse
import concurrent.futures
import dataclasses
import os
import statistics
import subprocess
import time

from meshrl.config.sandbox import SandboxConfig
from meshrl.rpc import Client, Server
from meshrl.v1 import sandbox_pb2
from services.sandbox.servicer import SandboxServicer

PROGRAM = "def f(x):\n    return x * 2\nassert f(3) == 6\n"  # a trivial graded sample


@dataclasses.dataclass
class Calls:
    ms: list[float]  # each call's wall time, sorted
    cpu_ms: float  # the whole machine's busy CPU time a call, its waits included (a warm pool's refills)


def busy_s() -> float:
    """CPU seconds every core of the machine has spent not idle since boot (/proc/stat)."""
    ticks = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def times(call, n: int, before=lambda: None) -> Calls:
    out, cpu = [], busy_s()
    for _ in range(n):
        before()
        start = time.perf_counter()
        call()
        out.append((time.perf_counter() - start) * 1000)
    before()
    return Calls(sorted(out), (busy_s() - cpu) * 1000 / n)


def row(name: str, calls: Calls, base: float | None = None) -> str:
    ms = calls.ms
    p50, p99 = statistics.median(ms), ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    extra = f"+{p50 - base:.1f}" if base is not None else "-"
    return f"| {name} | {p50:.1f} | {p99:.1f} | {extra} | {calls.cpu_ms:.1f} |"


def sandboxed(servicer, argv: list[str], calls: int, wait_for_pool: bool = False) -> Calls:
    limits = servicer.limits(sandbox_pb2.Limits())

    def call():
        result = servicer._in_slot(argv, {}, b"", limits, False)
        assert result.exit_code == 0, result

    def full():
        while wait_for_pool and servicer.pool.count() < servicer.cfg.warm:
            time.sleep(0.002)

    return times(call, calls, full)


def served(servicer, calls: int, threads: int, wait_for_pool: bool) -> tuple[Calls, float, float]:
    """Run over gRPC one at a time (ms), then `threads` clients at once: Runs a second, the share warm."""
    server = Server([servicer], max_workers=threads * 2).start()
    client = Client(server.address, SandboxServicer.SERVICE, timeout=60, retries=0)
    request = sandbox_pb2.RunRequest(argv=["python3", "main.py"], files={"main.py": PROGRAM.encode()})

    def code(_=None) -> int:
        reply = client.call("Run", request)
        assert isinstance(reply, sandbox_pb2.RunResponse)
        return reply.exit_code

    def full():
        while wait_for_pool and servicer.pool.count() < servicer.cfg.warm:
            time.sleep(0.002)

    one = times(code, calls, full)
    full()
    warm_before, start = servicer.counts["warm_runs"], time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        codes = list(pool.map(code, range(calls)))
    rate = calls / (time.perf_counter() - start)
    server.stop(0)
    assert codes == [0] * calls, codes
    return one, rate, (servicer.counts["warm_runs"] - warm_before) / calls


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--threads", type=int, default=4)
    args = p.parse_args()
    cold = SandboxServicer(SandboxConfig(concurrency=args.threads, warm=0))
    warm = SandboxServicer(SandboxConfig(concurrency=args.threads, first_uid=62100))  # the default pool
    program = ["python3", "-c", PROGRAM]
    direct = times(lambda: subprocess.run(["/usr/bin/python3", "-c", PROGRAM], check=True), args.calls)
    boxed = sandboxed(cold, program, args.calls)
    place, cold.cgroups = cold.cgroups, None
    bare = sandboxed(cold, program, args.calls)
    cold.cgroups = place
    ready = sandboxed(warm, program, args.calls, wait_for_pool=True)
    start_cold = sandboxed(cold, ["true"], args.calls)
    start_warm = sandboxed(warm, ["true"], args.calls, wait_for_pool=True)
    served_cold, rate_cold, _ = served(cold, args.calls, args.threads, False)
    served_warm, rate_warm, share = served(warm, args.calls, args.threads, True)
    cold.close()
    warm.close()
    base = statistics.median(direct.ms)
    print("| how | p50 ms | p99 ms | p50 over direct | CPU ms a Run |\n|---|---|---|---|---|")
    print(row("direct (subprocess)", direct))
    print(row(f"cold sandbox (cgroups: {place.kind if place else 'none'})", boxed, base))
    if place is not None:
        print(row("cold sandbox without its cgroup", bare, base))
    print(row("warm sandbox (from the pool)", ready, base))
    print(row("SandboxService.Run over gRPC, cold", served_cold, base))
    print(row("SandboxService.Run over gRPC, warm", served_warm, base))
    print(row("a sandbox's start alone (`true`), cold", start_cold))
    print(row("a sandbox's start alone (`true`), warm", start_warm))
    print(
        f"\n{rate_cold:.0f} graded samples/s with {args.threads} clients, every Run cold; {rate_warm:.0f}/s with the"
        f" pool of {warm.cfg.warm} ({share:.0%} of the Runs warm); {args.calls} Runs each, all passed"
    )


if __name__ == "__main__":
    main()
