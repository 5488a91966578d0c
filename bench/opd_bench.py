"""On-policy distillation against GRPO from the same start (issue 48): held-out greedy accuracy at every
validation, and what the teacher costs in a step.

Both runs start from the main job's SFT warm-up (RUN/sft/hf) with the main job's GRPO settings
(configs/arithmetic_grpo.yaml) and the same seed. GRPO learns from the task's scores; `meshrl opd` learns
from the teacher alone, the main job's GRPO result (RUN/grpo/hf), which grades each sampled token (its
log-prob minus the student's is the advantage; no score reaches the update). The teacher's cost is its
log-prob pass (timing_s/teacher) against the student's update (timing_s/update_actor), medians over the
steps. Run the main job first (`bash scripts/run.sh`): it leaves RUN.

    .venv/bin/python bench/opd_bench.py [--run runs/default] [--steps 40] [--val-every 10] [--seed 0]
"""

import argparse
import json
import pathlib
import shutil
import statistics
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def accuracies(run_dir: pathlib.Path) -> dict[int, float]:
    out = {}
    for line in (run_dir / "val.jsonl").read_text().splitlines():
        row = json.loads(line)
        out[row["step"]] = sum(c == "1" for c in row["correct"]) / len(row["correct"])
    return out


def median_of(run_dir: pathlib.Path, key: str) -> float:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    values = [r[key] for r in rows if key in r]
    return statistics.median(values) if values else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", default="runs/default")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--val-every", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    run = pathlib.Path(a.run).resolve()
    student, teacher = run / "sft" / "hf", run / "grpo" / "hf"
    if not (student.is_dir() and teacher.is_dir()):
        sys.exit(f"{run}: no sft/hf and grpo/hf; run the main job first (bash scripts/run.sh)")
    out = run / "opd_bench"
    shutil.rmtree(out, ignore_errors=True)
    common = [
        f"actor.model={student}",
        f"data.train_files={run / 'data/train.parquet'}",
        f"data.val_files={run / 'data/test.parquet'}",
        f"trainer.total_steps={a.steps}",
        f"trainer.val_every={a.val_every}",
        f"trainer.seed={a.seed}",
        "trainer.trace=",
    ]
    runs = {"grpo": [], "opd": [f"teacher.model={teacher}"]}
    for name, extra in runs.items():
        cmd = [str(ROOT / ".venv/bin/meshrl"), name, "--config", str(ROOT / "configs/arithmetic_grpo.yaml")]
        subprocess.run([*cmd, *common, *extra, f"trainer.run_dir={out / name}"], check=True, cwd=ROOT)
    acc = {name: accuracies(out / name) for name in runs}
    print(f"\nfrom {student} (seed {a.seed}); teacher for opd: {teacher}")
    print("| step | " + " | ".join(runs) + " |\n|---|" + "---|" * len(runs))
    for step in sorted(acc["grpo"]):
        print(f"| {step} | " + " | ".join(f"{acc[n].get(step, float('nan')):.3f}" for n in runs) + " |")
    opd = out / "opd"
    teach, update = median_of(opd, "timing_s/teacher"), median_of(opd, "timing_s/update_actor")
    step_s = {n: median_of(out / n, "timing_s/step") for n in runs}
    print(f"\nopd step: teacher log-probs {teach:.3f} s, student update {update:.3f} s ({teach / update:.2f}x)")
    print("median step seconds: " + ", ".join(f"{n} {s:.2f}" for n, s in step_s.items()))


if __name__ == "__main__":
    main()
