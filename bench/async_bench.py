"""Sampling ahead (trainer.max_staleness=K) against the synchronous loop: samples/s, wall time and held-out
accuracy for the same number of steps with K = 0, 1, 2 (issue 15's benchmark).

The main job's GRPO settings (configs/arithmetic_grpo.yaml) from its SFT warm-up (scripts/prepare.sh),
with the rollout and the actor pinned to disjoint cores, standing in for separate devices: the rollout
(hf backend, 1 torch thread), the reward service and this process (the orchestrator, whose producer
thread decodes and scores what the rollout sends) on core 0, the actor (one rank, 1 thread) alone on
core 1. Every K runs with the off-policy correction (algorithm.rollout_is=token; with K=0 its weights are
~1). Each K starts its own rollout and actor. samples/s counts
the steps after the first (rows trained / the sum of their step times); accuracy is greedy, on the 500
held-out problems, after the last step.

    bash scripts/prepare.sh runs/default
    .venv/bin/python bench/async_bench.py [--steps 40] [--staleness 0 1 2] [--repeats 1] [--deterministic true]
"""

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

from push_memory_bench import family

from orchestrator.config import load_config
from orchestrator.lifecycle.roles import serve_args
from orchestrator.lifecycle.services import launch
from orchestrator.main import run

ROWS = 32 * 8  # samples a step (the config's 32 prompts x 8)


def pin(pid: int, core: int) -> None:
    """Every thread of the process and of its children onto one core (threads started later inherit it)."""
    for p in family(pid):
        for tid in os.listdir(f"/proc/{p}/task"):
            os.sched_setaffinity(int(tid), {core})


def one_run(
    run_dir: pathlib.Path, model: pathlib.Path, data: pathlib.Path, steps: int, k: int, deterministic: bool
) -> dict:
    overrides = [
        f"actor.model={model}",
        f"data.train_files={data / 'train.parquet'}",
        f"data.val_files={data / 'test.parquet'}",
        f"trainer.run_dir={run_dir}",
        f"trainer.total_steps={steps}",
        f"trainer.val_every={steps}",
        "trainer.logger=[]",
        "actor.threads=1",
        "actor.world_size=1",
        f"trainer.max_staleness={k}",
        f"trainer.deterministic={str(deterministic).lower()}",
        "algorithm.rollout_is=token",
    ]
    cfg = load_config("configs/arithmetic_grpo.yaml", overrides)
    rollout, rollout_address = launch(serve_args(cfg, "rollout"), env={**os.environ, "OMP_NUM_THREADS": "1"})
    actor, actor_address = launch(serve_args(cfg, "actor"))  # started on core 0 too, then moved
    try:
        pin(rollout.pid, 0)
        pin(actor.pid, 1)
        start = time.perf_counter()
        out = run(
            "grpo",
            load_config(
                "configs/arithmetic_grpo.yaml",
                [*overrides, f"rollout.address={rollout_address}", f"actor.address={actor_address}"],
            ),
        )
        whole = time.perf_counter() - start
    finally:
        for p in (rollout, actor):
            p.terminate()
            p.wait(120)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    step_s = [r["timing_s/step"] for r in rows if r.get("step", 0) > 1 and "timing_s/step" in r]
    acc = [r["val/acc/mean"] for r in rows if "val/acc/mean" in r]
    trained = [r for r in rows if r.get("step", 0) > 1]
    phases = {
        k: statistics.median(r.get(f"timing_s/{k}", 0.0) for r in trained)
        for k in ("gen", "reward", "old_log_prob", "update_actor", "update_weights", "wait_batch")
    }
    return {
        "samples_per_s": ROWS * len(step_s) / sum(step_s),
        "median_step": statistics.median(step_s),
        "whole": whole,
        "acc_first": acc[0],
        "acc_last": acc[-1],
        "phases": phases,
        "staleness": statistics.mean(r.get("async/staleness", 0.0) for r in rows if r.get("step", 0) > 0),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", default="runs/default", help="where scripts/prepare.sh put the model and data")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--staleness", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--deterministic", default="true", choices=["true", "false"])
    a = ap.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        sys.exit("this benchmark pins the rollout and the actor to two different cores: it needs 2")
    run_root = pathlib.Path(a.run)
    model, data = (run_root / "sft" / "hf").absolute(), (run_root / "data").absolute()
    if not (model / "config.json").is_file():
        sys.exit(f"no SFT checkpoint at {model}: run `bash scripts/prepare.sh {run_root}` first")
    os.sched_setaffinity(0, {0})  # and the reward service this process starts
    results: dict[int, list[dict]] = {k: [] for k in a.staleness}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.repeats):
            for k in a.staleness:
                results[k].append(
                    one_run(pathlib.Path(tmp) / f"k{k}-{i}", model, data, a.steps, k, a.deterministic == "true")
                )
    base = statistics.median(r["samples_per_s"] for r in results[a.staleness[0]])
    print(f"\n{a.steps} steps of {ROWS} samples, {a.repeats} run(s) each, alternated; deterministic={a.deterministic}")
    print(
        f"| K | samples/s | x K={a.staleness[0]} | median step | gen / update_actor / waited for the batch | "
        "mean staleness | whole run | held-out accuracy (step 0 -> last) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for k, runs in results.items():
        sps = statistics.median(r["samples_per_s"] for r in runs)
        wall = " / ".join(f"{r['whole']:.0f} s" for r in runs)
        acc = " / ".join(f"{r['acc_first']:.3f} -> {r['acc_last']:.3f}" for r in runs)
        ph = {name: statistics.median(r["phases"][name] for r in runs) for name in runs[0]["phases"]}
        print(
            f"| {k} | {sps:.0f} | {sps / base:.2f} | {statistics.median(r['median_step'] for r in runs):.3f} s | "
            f"{ph['gen']:.3f} / {ph['update_actor']:.3f} / {ph['wait_batch']:.3f} s | "
            f"{statistics.mean(r['staleness'] for r in runs):.2f} | {wall} | {acc} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
