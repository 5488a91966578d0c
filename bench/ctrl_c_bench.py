"""Ctrl-C under load: N small GRPO runs (the Ctrl-C test's settings), each sent SIGINT to its process group at
a random moment after step 1, with a CPU-bound process on one core beside them; per run the seconds from
SIGINT to the orchestrator's exit, its exit code, and any service left running. A run that has not exited
90 s after its SIGINT counts as hung (its threads' stacks are printed: SIGUSR1, cli.main's faulthandler).

    .venv/bin/python bench/ctrl_c_bench.py [--runs 30] [--tree DIR] [--no-load]

Each run is the command users type: the installed `meshrl` of this venv. --tree runs another checkout's
code with this venv as `python -m cli` (e.g. a `git worktree` of an older commit), for a before/after
comparison in one sitting. Prints one line per run, then a summary line for RESULTS.md.
"""

import argparse
import os
import pathlib
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import psutil

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from meshrl.tiny.arithmetic import ArithmeticConfig, make_data  # noqa: E402
from meshrl.tiny.models import TinyModelConfig, make_model  # noqa: E402
from testkit.runs import grpo_command  # noqa: E402

HUNG = 90.0  # seconds after SIGINT


def one_run(model, data, tree: pathlib.Path, work: pathlib.Path, delay: float) -> tuple[float | None, int, int]:
    """(seconds from SIGINT to exit or None if hung, exit code, services left running)."""
    run = work / "run"
    shutil.rmtree(run, ignore_errors=True)
    command = grpo_command(model, data, run, 1000)
    if tree == ROOT:  # the installed command (its entry point), not `python -m cli`
        command = [str(pathlib.Path(sys.executable).parent / "meshrl"), *command[3:]]
    proc = subprocess.Popen(
        command,
        cwd=tree,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    start = time.monotonic()
    metrics = run / "metrics.jsonl"
    while not (metrics.is_file() and metrics.read_text().strip()):
        if proc.poll() is not None or time.monotonic() - start > 300:
            raise RuntimeError(f"the run did not reach step 1: {proc.communicate()[1][-2000:]}")
        time.sleep(0.2)
    time.sleep(delay)
    family = psutil.Process(proc.pid).children(recursive=True)
    sent = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.communicate(timeout=HUNG)
        seconds: float | None = time.monotonic() - sent
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGUSR1)
        time.sleep(3)
        proc.kill()
        print(proc.communicate()[1][-8000:], file=sys.stderr)
        seconds = None
    alive = psutil.wait_procs(family, timeout=60)[1]
    for p in alive:
        p.kill()
    return seconds, proc.returncode, len(alive)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--tree", default=str(ROOT), help="the checkout whose code runs (this venv's packages)")
    p.add_argument("--no-load", action="store_true", help="no CPU-bound process beside the runs")
    args = p.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="ctrl-c-bench-"))
    model = make_model(work / "lm", TinyModelConfig(kind="causal"))
    data = make_data(work / "data", ArithmeticConfig(num_train=300, num_test=50, ops="+-", max_operand=20))
    burner = None if args.no_load else subprocess.Popen([sys.executable, "-c", "while True: pass"])
    rng = random.Random(0)
    times, hung, leftover = [], 0, 0
    try:
        for i in range(args.runs):
            delay = round(rng.uniform(0, 3), 2)
            seconds, code, alive = one_run(model, data, pathlib.Path(args.tree), work, delay)
            took = "hung" if seconds is None else f"{seconds:.1f} s"
            print(f"run {i + 1}: SIGINT {delay} s after step 1: exit {code} after {took}, {alive} left")
            hung += seconds is None
            leftover += alive
            if seconds is not None:
                times.append(seconds)
    finally:
        if burner is not None:
            burner.kill()
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"{args.runs} runs{'' if args.no_load else ' under load'}: {hung} hung, {leftover} services left; "
        f"SIGINT to exit median {statistics.median(times):.1f} s (min {min(times):.1f}, max {max(times):.1f})"
    )


if __name__ == "__main__":
    main()
