"""A judge's cost (issue 62): judge calls per second, the step with a judge against the same step with the
rule reward alone, the share of judgements the cache serves, and the judge's cost when the step samples
ahead.

The main job's step (configs/arithmetic_grpo.yaml: 32 prompts x n=8, the hf rollout, one actor rank) from
its SFT warm-up (scripts/prepare.sh, built once into --work), with the warm-up itself as the judge, served
by the run's own rollout service (judge.model), pointwise and greedy: what it says is not read for
learning here (its unreadable verdicts are scored 0 and counted), only what judging costs. Modes:

    rule         the rule reward alone
    judge        the rule (reward_weight 1) + the judge (weight 1)
    rule-ahead   trainer.max_staleness=1 (the next step sampled and scored while this one updates)
    judge-ahead  the same with the judge
    cached       the judge on a data file of --repeat prompts, so each step meets answers judged before

Each mode runs --steps steps; step times are the median over the steps after the first (that one starts the
services). Modes alternate over --repeats rounds.

    .venv/bin/python bench/judge_bench.py [--steps 8] [--repeats 1] [--work runs/bench-judge]
"""

import argparse
import json
import pathlib
import shutil
import statistics
import subprocess
import sys

import pandas as pd

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from orchestrator.config import load_config  # noqa: E402
from orchestrator.main import run  # noqa: E402

MODES = {
    "rule": [],
    "judge": ["judge.model={sft}"],
    "rule-ahead": ["trainer.max_staleness=1", "algorithm.rollout_is=token"],
    "judge-ahead": ["judge.model={sft}", "trainer.max_staleness=1", "algorithm.rollout_is=token"],
    "cached": ["judge.model={sft}", "data.train_files={repeated}"],
}
JUDGED = ["judge.template={prompt}{response}?{ground_truth}", "judge.max_new_tokens=4", "judge.retries=0"]


def one_run(work: pathlib.Path, mode: str, steps: int, round_: int) -> dict:
    sft, data = work / "sft" / "hf", work / "data"
    fill = {"sft": sft, "repeated": work / "repeated.parquet"}
    overrides = [
        f"actor.model={sft}",
        f"data.train_files={data / 'train.parquet'}",
        f"trainer.run_dir={work / f'{mode}-{round_}'}",
        f"trainer.total_steps={steps}",
        "trainer.val_every=0",
        "trainer.save_every=0",
        "trainer.save_final=false",
        "trainer.logger=[]",
        "trainer.trace=",
        "actor.engine=plain",
        "actor.world_size=1",
        "reward.workers=1",
        *(o.format(**fill) for o in MODES[mode]),
        *(JUDGED if "judge.model={sft}" in MODES[mode] else []),
    ]
    shutil.rmtree(work / f"{mode}-{round_}", ignore_errors=True)  # a run refuses a folder a run trained in
    out = run("grpo", load_config(str(ROOT / "configs/arithmetic_grpo.yaml"), overrides))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    timed = [r for r in rows if r.get("step", 0) > 1]
    got = {"step_s": statistics.median(r["timing_s/step"] for r in timed)}
    if "judge/calls" in timed[0]:
        calls, seconds = sum(r["judge/calls"] for r in timed), sum(r["timing_s/judge"] for r in timed)
        got |= {
            "calls_per_s": calls / seconds,
            "judge_s": statistics.median(r["timing_s/judge"] for r in timed),
            "cached_share": statistics.mean(r["judge/cached_share"] for r in timed),
        }
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=32, help="prompts in the cached mode's data file")
    ap.add_argument("--work", default=str(ROOT / "runs" / "bench-judge"))
    ap.add_argument("--modes", default=",".join(MODES), help="which modes to run (the summary needs all)")
    a = ap.parse_args()
    work = pathlib.Path(a.work)
    subprocess.run(["bash", str(ROOT / "scripts/prepare.sh"), str(work)], check=True)
    pd.read_parquet(work / "data" / "train.parquet").head(a.repeat).to_parquet(work / "repeated.parquet")
    results: dict[str, list[dict]] = {m: [] for m in a.modes.split(",")}
    for r in range(a.repeats):
        for mode in results:
            results[mode].append(one_run(work, mode, a.steps, r))
            print(mode, results[mode][-1], flush=True)
    if len(results) < len(MODES):
        return
    med = {m: {k: statistics.median(x[k] for x in v) for k in v[0]} for m, v in results.items()}
    print(f"\n{a.steps} steps x {a.repeats} rounds; median step time after the first step")
    print(f"judge calls/s (served judge, one Generate a step): {med['judge']['calls_per_s']:.0f}")
    print(
        f"step with judge / rule alone: {med['judge']['step_s']:.2f} s / {med['rule']['step_s']:.2f} s "
        f"= {med['judge']['step_s'] / med['rule']['step_s']:.2f}x (judging {med['judge']['judge_s']:.2f} s a step)"
    )
    print(
        f"sampling ahead, with judge / without: {med['judge-ahead']['step_s']:.2f} s / "
        f"{med['rule-ahead']['step_s']:.2f} s = {med['judge-ahead']['step_s'] / med['rule-ahead']['step_s']:.2f}x"
    )
    print(f"cached share on {a.repeat} repeated prompts: {med['cached']['cached_share']:.2f} "
          f"(the main job's data: {med['judge']['cached_share']:.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
