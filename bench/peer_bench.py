"""The mesh against TRL's GRPOTrainer and a bare one-process loop on the main job's task, one run at a
time on this machine.

    bash scripts/prepare.sh runs/default            # the SFT warm-up and data they all start from
    python3 -m venv /tmp/trl && /tmp/trl/bin/pip install torch==2.13.0 trl==1.16.0 transformers==5.19.0 pandas
    .venv/bin/python bench/peer_bench.py --trl-python /tmp/trl/bin/python [--steps 80] [--repeats 1]
        [--seeds 0,1,2] [--settings trl,config] [--mesh-extra KEY=VALUE ...] [--out RESULTS.json]

All from runs/default/sft/hf with the same data and settings (configs/arithmetic_grpo.yaml; TRL's side:
bench/peer_trl.py; the bare loop: bench/peer_bare.py), at two settings, a table each:
- trl: one optimizer step per batch at lr 1e-4, as TRL's defaults have it; the mesh runs twice, with the
  config's hf rollout and with vLLM;
- config: the config's own, four optimizer steps per batch (mini-batches of 64) at lr 5e-5 (TRL:
  steps_per_generation=4 and its old log-prob pass).
--mesh-extra adds dotted overrides to every mesh run (e.g. actor.padding_free=true); --sides picks the
sides (hf, vllm, vllm-packed: vLLM and a padding-free actor, trl, bare). --seeds runs every side once per
seed (the mesh's trainer.seed, the peers' --seed: the data's order and the sampling; the model is the same
SFT checkpoint), and a second table compares how each side learns: held-out accuracy at the last step
(mean and standard error over the seeds), and per optimizer step the training reward, the clipped share
of tokens and the gradient norm, from the mesh's metrics.jsonl and TRL's logs. --out keeps every run's
figures as JSON.

A bigger, real-shaped model: `--model-size 50m` starts every side from the same fresh ~50M-parameter
qwen2 (the task's char tokenizer; its answers run to every length up to the limit, as a real model's
vary), e.g. `--model-size 50m --settings trl --sides vllm,vllm-packed,trl --prompts 4 --samples 8
--max-new-tokens 128 --steps 5`. Reports median
s/step and samples/s (steps after the first) with its ratio to TRL's and the bare loop's, start-up
(command start to the first step's start, step-0 validation included on every side), the whole
command, and held-out greedy accuracy every 20 steps. TRL lives in its own venv: it is not a
dependency of meshrl.
"""

import argparse
import functools
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

from meshrl.tiny.models import TinyModelConfig, make_model
from meshrl.trace_view import load_spans

BIG = {  # a fresh model of a supported family, the task's char tokenizer: it samples its end token about once
    # in as many tokens as its vocabulary holds, so its answers run to lengths of all sizes up to the limit
    "50m": TinyModelConfig(
        family="qwen2", hidden_size=640, num_layers=8, num_heads=10, num_kv_heads=5, intermediate_size=2560
    ),
}
SETTINGS = {  # name: (the mesh's overrides, the peers' flags)
    "trl": (["actor.lr=1e-4", "actor.mini_batch_size=0"], ["--optimizer-steps", "1", "--lr", "1e-4"]),
    "config": ([], ["--optimizer-steps", "4", "--lr", "5e-5"]),
}
PHASES = ("gen", "old_log_prob", "update_actor")  # the mesh's, from metrics.jsonl


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
        "phase_s": {p: [r[f"timing_s/{p}"] for r in rows if f"timing_s/{p}" in r] for p in PHASES},
        "val": {r["step"]: r["val/acc/mean"] for r in rows if "val/acc/mean" in r},
    }


def peer(  # limit: a command line's parts
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


def shape(a) -> tuple[list[str], list[str]]:
    """The batch's shape as the mesh's overrides and the peers' flags."""
    mesh_keys = [
        f"data.train_batch_size={a.prompts}",
        f"rollout.n={a.samples}",
        f"rollout.max_new_tokens={a.max_new_tokens}",
        f"rollout.max_model_len={max(256, 64 + a.max_new_tokens)}",
    ]
    flags = ["--prompts", str(a.prompts), "--samples", str(a.samples), "--max-new-tokens", str(a.max_new_tokens)]
    return mesh_keys, flags


def sides(a, data: pathlib.Path, model: pathlib.Path, setting: str) -> dict:
    overrides, flags = SETTINGS[setting]
    mesh_keys, shape_flags = shape(a)
    if setting == "config":  # the config's four mini-batches, whatever the batch
        overrides = [f"actor.mini_batch_size={a.prompts * a.samples // 4}"]
    overrides, flags = [*overrides, *mesh_keys, *a.mesh_extra], [*flags, *shape_flags]
    run = functools.partial(mesh, data, model, a.steps)
    trl = functools.partial(peer, a.trl_python, "bench/peer_trl.py", data, model, a.steps)
    bare = functools.partial(peer, sys.executable, "bench/peer_bare.py", data, model, a.steps)
    every = {  # name: (what the table calls it, (folder, seed) -> the run's figures)
        "hf": ("meshrl grpo, hf rollout (the config's)", lambda o, s: run(o, *overrides, f"trainer.seed={s}")),
        "vllm": (
            "meshrl grpo, vLLM rollout",
            lambda o, s: run(o, *overrides, "rollout.backend=vllm", f"trainer.seed={s}"),
        ),
        "vllm-packed": (
            "meshrl grpo, vLLM rollout, padding-free actor",
            lambda o, s: run(o, *overrides, "rollout.backend=vllm", "actor.padding_free=true", f"trainer.seed={s}"),
        ),
        "trl": ("TRL GRPOTrainer", lambda o, s: trl(o, *flags, "--seed", str(s))),
        "bare": ("bare loop", lambda o, s: bare(o, *flags, "--seed", str(s))),
    }
    chosen = a.sides.split(",") if a.sides else ["hf", *(["vllm"] if setting == "trl" else []), "trl", "bare"]
    if "trl" in chosen and not a.trl_python:
        sys.exit("the trl side needs --trl-python: the python of a venv with trl installed")
    return {every[k][0]: every[k][1] for k in chosen}


def phases(runs: list[dict]) -> str:
    """The mesh's median seconds a step in each phase (steps after the first)."""
    if "phase_s" not in runs[0] or not runs[0]["phase_s"].get("gen"):
        return ""
    return ", ".join(
        f"{p} {statistics.median(s for r in runs for s in r['phase_s'][p][1:]):.3f}"
        for p in PHASES
        if runs[0]["phase_s"].get(p)
    )


def table(setting: str, steps: int, repeats: int, a, results: dict[str, list[dict]]) -> None:
    rows, batch = a.prompts * a.samples, f"{a.prompts} prompts x {a.samples} samples of up to {a.max_new_tokens} tokens"
    medians = {name: statistics.median(s for r in runs for s in r["step_s"][1:]) for name, runs in results.items()}
    bare = medians.get("bare loop", float("nan"))  # nan: a side not run (--sides) shows as nan
    trl = medians.get("TRL GRPOTrainer", float("nan"))
    print(f"\n{setting} settings: {steps} steps of {batch}, {repeats} run(s) each, alternated:")
    print(
        "| | median s/step | x TRL | x bare loop | samples/s | start-up to step 1 | whole command "
        "| held-out accuracy by step | mesh phases, median s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, runs in results.items():
        step = medians[name]
        val = " / ".join(" ".join(f"{v:.2f}" for _, v in sorted(r["val"].items())) for r in runs)
        print(
            f"| {name} | {step:.3f} | {step / trl:.2f} | {step / bare:.2f} | "
            f"{rows / step:.0f} | {seconds(r['first_step_at_s'] for r in runs)} "
            f"| {seconds(r['whole_s'] for r in runs)} "
            f"| {val} | {phases(runs)} |"
        )


# per optimizer step: (the mesh's metric, TRL's logged key); the mesh logs a batch's mean over its steps
DYNAMICS = {
    "training reward": ("critic/score/mean", "reward"),
    "clipped share": ("actor/pg_clipfrac", "clip_ratio/region_mean"),
    "grad norm": ("actor/grad_norm", "grad_norm"),
}


def dynamics(run: dict) -> dict[str, float]:
    """A run's mean of each DYNAMICS figure over its steps; nan where the side does not log it."""
    out = {}
    for name, (mesh_key, trl_key) in DYNAMICS.items():
        if "metrics" in run:
            values = [r[mesh_key] for r in run["metrics"] if mesh_key in r]
        else:
            values = [r[trl_key] for r in run.get("logs", []) if trl_key in r]
        out[name] = statistics.fmean(values) if values else float("nan")
    return out


def learning(results: dict[str, list[dict]]) -> None:
    """How each side learned over its runs (seeds): the last held-out accuracy, mean and standard error,
    each run's, and the DYNAMICS means."""
    print("\n| | held-out at the last step, mean ± s.e. (each run) | " + " | ".join(DYNAMICS) + " |")
    print("|---|---|" + "---|" * len(DYNAMICS))
    for name, runs in results.items():
        last = [r["val"][max(r["val"])] for r in runs]
        se = statistics.stdev(last) / len(last) ** 0.5 if len(last) > 1 else float("nan")
        means = [statistics.fmean(dynamics(r)[k] for r in runs) for k in DYNAMICS]
        each = " ".join(f"{v:.3f}" for v in last)
        figures = " | ".join(f"{m:.4f}" for m in means)
        print(f"| {name} | {statistics.fmean(last):.3f} ± {se:.3f} ({each}) | {figures} |")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trl-python", default="", help="python of a venv with trl installed (for the trl side)")
    ap.add_argument("--run", default="runs/default", help="where scripts/prepare.sh put the model and data")
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--seeds", default="0", help="comma-separated: every side runs once per seed")
    ap.add_argument("--out", default="", help="a JSON file for every run's figures")
    ap.add_argument("--settings", default="trl,config", help="comma-separated: trl, config")
    ap.add_argument("--mesh-extra", nargs="*", default=[], help="dotted overrides for every mesh run")
    ap.add_argument("--sides", default="", help="comma-separated of hf, vllm, vllm-packed, trl, bare (default: all)")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument(
        "--model-size",
        choices=["sft", *BIG],
        default="sft",
        help="sft: the main job's SFT model; 50m: a fresh qwen2 of ~50M parameters (its answers run long)",
    )
    a = ap.parse_args()
    run = pathlib.Path(a.run)
    model, data = (run / "sft" / "hf").absolute(), (run / "data").absolute()
    if not (model / "config.json").is_file():
        sys.exit(f"no SFT checkpoint at {model}: run `bash scripts/prepare.sh {run}` first")
    if a.model_size != "sft":
        model = make_model(pathlib.Path(tempfile.mkdtemp()) / a.model_size, BIG[a.model_size]).absolute()
    everything: dict[str, dict] = {}
    for setting in a.settings.split(","):
        if setting not in SETTINGS:
            sys.exit(f"--settings: each of {sorted(SETTINGS)}, got {setting!r}")
        runs = sides(a, data, model, setting)
        results: dict[str, list[dict]] = {name: [] for name in runs}
        seeds = [int(s) for s in a.seeds.split(",")]
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(a.repeats):
                for seed in seeds:
                    for j, (name, side) in enumerate(runs.items()):
                        results[name].append(side(pathlib.Path(tmp) / f"{j}-{i}-{seed}", seed))
        table(setting, a.steps, a.repeats * len(seeds), a, results)
        learning(results)
        everything[setting] = results
    if a.out:
        pathlib.Path(a.out).write_text(json.dumps(everything, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
