"""Reward benchmark: samples/s through the reward service vs the same function in a loop, same run.

Two functions: the built-in arithmetic scorer (microseconds a sample) and a
verl-style user function that checks \\boxed{} answers with math-verify
(milliseconds a sample). The service runs as `meshrl serve reward` in its own
process with its worker pool; clients send batches of --batch samples, one
client or several at once.

    .venv/bin/python bench/reward_bench.py [--samples 2000] [--workers 2]
"""

import argparse
import pathlib
import random
import subprocess
import sys
import threading
import time

from meshrl.clients import RewardClient
from meshrl.dataproto import DataProto
from meshrl.errors import ServiceError
from services.reward.functions import load

HERE = pathlib.Path(__file__).resolve().parent
USER_FN = f"{HERE / 'math_reward.py'}:compute_score"


def arithmetic_samples(n: int, rng: random.Random) -> list[tuple]:
    out = []
    for _ in range(n):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        out.append(("arithmetic", str(a + b + rng.choice([0, 0, 1])), str(a + b), None))
    return out


def math_samples(n: int, rng: random.Random) -> list[tuple]:
    out = []
    for _ in range(n):
        p, q = rng.randint(1, 9), rng.randint(2, 9)
        pred = rng.choice([f"\\frac{{{p}}}{{{q}}}", f"\\frac{{{2 * p}}}{{{2 * q}}}", f"{p / q:.6f}", f"{p + 1}"])
        out.append(("lighteval/MATH", f"The answer is \\boxed{{{pred}}}.", f"\\frac{{{p}}}{{{q}}}", None))
    return out


def as_batch(samples: list[tuple]) -> DataProto:
    return DataProto(
        non_tensor_batch={
            "data_source": [s[0] for s in samples],
            "response_text": [s[1] for s in samples],
            "reward_model": [{"ground_truth": s[2]} for s in samples],
        }
    )


def in_process(spec: str, samples: list[tuple]) -> float:
    fn = load(spec)
    t0 = time.perf_counter()
    for s in samples:
        fn(*s)
    return len(samples) / (time.perf_counter() - t0)


def start_service(spec: str, workers: int) -> tuple[subprocess.Popen, str]:
    args = [sys.executable, "-m", "cli", "serve", "reward", "--workers", str(workers)]
    if spec != "builtin":
        args += ["--function", spec]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None  # piped
    line = proc.stdout.readline()
    if "listening on" not in line:
        raise RuntimeError(f"reward service did not start: {line!r}")
    return proc, line.split()[-1]


def through_service(address: str, samples: list[tuple], batch: int, clients: int) -> float:
    batches = [as_batch(samples[i : i + batch]) for i in range(0, len(samples), batch)]
    RewardClient(address).score(batches[0])  # warm-up: workers import their function
    errors = []

    def work(mine):
        c = RewardClient(address)
        try:
            for b in mine:
                c.score(b)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(batches[k::clients],)) for k in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return len(samples) / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    rng = random.Random(0)
    cases = [
        ("built-in arithmetic scorer", "builtin", arithmetic_samples(args.samples * 10, rng)),
        ("user function (math-verify)", USER_FN, math_samples(args.samples, rng)),
    ]
    print(f"samples/s, {args.workers} workers, batches of {args.batch}\n")
    print(
        "| function | in-process loop | service, 1 client | service, 4 clients | best / loop "
        "| service without workers, 1 client |\n|---|---|---|---|---|---|"
    )
    for name, spec, samples in cases:
        loop = in_process(spec, samples)
        rates: list[float | str] = []  # samples/s, or why it failed
        for workers, clients in ((args.workers, 1), (args.workers, 4), (0, 1)):
            proc, address = start_service(spec, workers)
            try:
                rates.append(through_service(address, samples, args.batch, clients))
            except ServiceError as e:  # e.g. math-verify's SIGALRM timeouts need a main thread
                rates.append(f"fails: {(e.details or '')[:60]}...")
            finally:
                proc.terminate()
                proc.wait()
        one, four, inline = rates
        assert isinstance(one, float) and isinstance(four, float), rates  # with workers it runs: the table needs both
        inline = inline if isinstance(inline, str) else f"{inline:,.0f}"
        print(
            f"| {name} | {loop:,.0f} | {one:,.0f} | {four:,.0f} | {max(one, four) / loop:.2f}x | {inline} |", flush=True
        )


if __name__ == "__main__":
    main()
