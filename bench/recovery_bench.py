"""How long a run takes to heal: a GRPO run on the tiny model (the chaos test's settings) in which the
rollout, the reward service and the actor are each killed (SIGKILL) once; for each kill, the seconds
from the kill to the next step logged, against the run's median step time and the service's start time.

    .venv/bin/python bench/recovery_bench.py [--steps 30] [--save-every 5]
    .venv/bin/python bench/recovery_bench.py --start-times   # each service alone: start to "listening on"

Prints a markdown table for bench/RESULTS.md. Goal (issue 13): recovery < 2 step times + the start time.
A dead actor costs more: the run goes back to its last checkpoint (up to save_every - 1 steps redone).
"""

import argparse
import json
import pathlib
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
from testkit.runs import chaos_settings, service, steps_logged  # noqa: E402


def start_times(model: pathlib.Path, repeats: int = 3) -> None:
    """Seconds from `meshrl serve ...` to its "listening on" line, each service alone, as a run starts it."""
    from orchestrator.lifecycle.services import launch

    for name, args in [
        ("rollout (hf)", ["rollout", "--backend", "hf", "--model", str(model), "--max-model-len", "64"]),
        ("reward", ["reward", "--workers", "1"]),
        ("actor (plain, 1 rank)", ["actor", "--model", str(model), "--engine", "plain", "--world-size", "1"]),
    ]:
        seconds = []
        for _ in range(repeats):
            t = time.monotonic()
            proc, _ = launch(args)
            seconds.append(time.monotonic() - t)
            proc.terminate()
            proc.wait()
        print(f"| {name} | {', '.join(f'{s:.1f}' for s in seconds)} | {statistics.median(seconds):.1f} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--save-every", type=int, default=5)
    ap.add_argument("--start-times", action="store_true", help="only each service's start time")
    args = ap.parse_args()
    tmp = pathlib.Path(tempfile.mkdtemp())
    model = make_model(tmp / "lm", TinyModelConfig(kind="causal"))
    if args.start_times:
        print("| service | seconds to listening (3 starts) | median |\n|---|---|---|")
        return start_times(model)
    data = make_data(tmp / "data", ArithmeticConfig())
    run_dir, log = tmp / "run", tmp / "run.log"
    kills = {6: "rollout", 13: "reward", 21: "actor"}  # after this step is logged
    overrides = [
        *chaos_settings(model, data, tmp, run_dir),
        f"trainer.total_steps={args.steps}",
        f"trainer.save_every={args.save_every}",
    ]
    started = time.monotonic()
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "cli", "grpo", *overrides], stdout=f, stderr=f, cwd=ROOT)
    orchestrator, killed_at, history, first_step = psutil.Process(proc.pid), {}, [], None
    while proc.poll() is None:
        logged = steps_logged(run_dir)
        now = time.monotonic()
        if logged and first_step is None:
            first_step = now - started
        history.append((now, len(logged)))
        for step, name in kills.items():
            if name not in killed_at and logged and max(logged) >= step:
                service(orchestrator, name).send_signal(signal.SIGKILL)
                killed_at[name] = (time.monotonic(), step)
        time.sleep(0.02)
    assert proc.returncode == 0, log.read_text()[-3000:]
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    step_s = statistics.median(m["timing_s/step"] for m in lines)
    print(
        f"GRPO on the tiny model, {args.steps} steps, checkpoint every {args.save_every}; median step "
        f"{step_s:.2f} s; command start to first step logged {first_step:.1f} s\n"
    )
    print("| killed | after step | seconds to the next step completed | x median step |\n|---|---|---|---|")
    for name, (t, step) in killed_at.items():
        # the first time after the kill that metrics.jsonl grew (a dead actor's run first drops the
        # steps after its checkpoint, then logs the redone ones)
        grown = next(now for (now, n), (_, before) in zip(history[1:], history) if now > t and n > before)
        print(f"| {name} | {step} | {grown - t:.1f} | {(grown - t) / step_s:.1f} |")


if __name__ == "__main__":
    main()
