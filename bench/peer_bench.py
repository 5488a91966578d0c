"""The mesh against TRL's GRPOTrainer and a bare one-process loop on the main job's task, one run at a
time on this machine.

    bash scripts/prepare.sh runs/default            # the SFT warm-up and data they all start from
    python3 -m venv /tmp/trl && /tmp/trl/bin/pip install torch==2.13.0 trl==1.16.0 transformers==5.19.0 pandas
    .venv/bin/python bench/peer_bench.py --trl-python /tmp/trl/bin/python [--steps 80] [--repeats 1]

All from runs/default/sft/hf with the same data and settings (configs/arithmetic_grpo.yaml, with one
optimizer step per batch at lr 1e-4 as TRL's side has it: bench/peer_trl.py; the bare loop:
bench/peer_bare.py). The mesh runs twice, with the config's hf rollout and with vLLM. Reports median
s/step and samples/s (steps after the first) with its ratio to TRL's and the bare loop's, start-up
(command start to the first step's start, step-0 validation included on every side), the whole
command, and held-out greedy accuracy every 20 steps. TRL lives in its own venv: it is not a
dependency of meshrl.
"""

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

from meshrl.trace_view import load_spans

ROWS = 32 * 8  # samples a step
SAME_AS_TRL = ["actor.lr=1e-4", "actor.mini_batch_size=0"]  # peer_trl.py's: one optimizer step per batch


def mesh(data: pathlib.Path, model: pathlib.Path, steps: int, out: pathlib.Path, *extra: str) -> dict:
    start = time.time()
    subprocess.run(
        [
            ".venv/bin/meshrl",
            "grpo",
            "--config",
            "configs/arithmetic_grpo.yaml",
            f"actor.model={model}",
            f"data.train_files={data / 'train.parquet'}",
            f"data.val_files={data / 'test.parquet'}",
            f"trainer.run_dir={out}",
            f"trainer.total_steps={steps}",
            "trainer.logger=[console]",
            f"trainer.save_every={steps}",
            *SAME_AS_TRL,
            *extra,
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    whole = time.time() - start
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    first = min(s["start_ns"] for s in load_spans(out) if s["name"] == "step" and s["attributes"]["meshrl.step"] == 1)
    return {
        "step_s": [r["timing_s/step"] for r in rows if "timing_s/step" in r],
        "whole_s": whole,
        "metrics": rows,
        "first_step_at_s": first / 1e9 - start,
        "val": {r["step"]: r["val/acc/mean"] for r in rows if "val/acc/mean" in r},
    }


def peer(
    python: str, script: str, data: pathlib.Path, model: pathlib.Path, steps: int, out: pathlib.Path, *flags: str
) -> dict:
    """bench/peer_trl.py or bench/peer_bare.py under `python`: their JSON, with the whole command's time."""
    start = time.time()
    subprocess.run(
        [
            python,
            script,
            str(model),
            str(data / "train.parquet"),
            str(data / "test.parquet"),
            str(steps),
            str(out),
            *flags,
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    result = json.loads(out.read_text())
    result["whole_s"] = time.time() - start
    result["val"] = {int(k): v for k, v in result["val"].items()}
    return result


def seconds(values) -> str:
    return " / ".join(f"{v:.1f} s" for v in values)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trl-python", required=True, help="python of a venv with trl installed")
    ap.add_argument("--run", default="runs/default", help="where scripts/prepare.sh put the model and data")
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--repeats", type=int, default=1)
    a = ap.parse_args()
    run = pathlib.Path(a.run)
    model, data = (run / "sft" / "hf").absolute(), (run / "data").absolute()
    if not (model / "config.json").is_file():
        sys.exit(f"no SFT checkpoint at {model}: run `bash scripts/prepare.sh {run}` first")
    sides = {
        "meshrl grpo, hf rollout (the config's)": lambda out: mesh(data, model, a.steps, out),
        "meshrl grpo, vLLM rollout": lambda out: mesh(data, model, a.steps, out, "rollout.backend=vllm"),
        "TRL GRPOTrainer": lambda out: peer(a.trl_python, "bench/peer_trl.py", data, model, a.steps, out),
        "bare loop": lambda out: peer(sys.executable, "bench/peer_bare.py", data, model, a.steps, out),
    }
    results: dict[str, list[dict]] = {name: [] for name in sides}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.repeats):
            for j, (name, side) in enumerate(sides.items()):
                results[name].append(side(pathlib.Path(tmp) / f"{j}-{i}"))
    medians = {name: statistics.median(s for r in runs for s in r["step_s"][1:]) for name, runs in results.items()}
    print(f"\n{a.steps} steps of 32 prompts x 8 samples, {a.repeats} run(s) each, alternated:")
    print(
        "| | median s/step | x TRL | x bare loop | samples/s | start-up to step 1 | whole command "
        "| held-out accuracy by step |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, runs in results.items():
        step = medians[name]
        val = " / ".join(" ".join(f"{v:.2f}" for _, v in sorted(r["val"].items())) for r in runs)
        print(
            f"| {name} | {step:.3f} | {step / medians['TRL GRPOTrainer']:.2f} | {step / medians['bare loop']:.2f} | "
            f"{ROWS / step:.0f} | {seconds(r['first_step_at_s'] for r in runs)} "
            f"| {seconds(r['whole_s'] for r in runs)} "
            f"| {val} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
