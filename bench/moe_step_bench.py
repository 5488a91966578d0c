"""A mixture of experts' GRPO step against a dense model of the same active parameters, through the mesh on the
tiny task (configs/arithmetic_grpo.yaml: hf rollout, one actor rank), and what routing replay costs.

    .venv/bin/python bench/moe_step_bench.py [--steps 10]

Models built here at the main job's sizes: a dense Qwen3 and a Qwen3-MoE of 8 experts, top 2, each expert
half the dense MLP's width, so a token runs the same MLP width in both (the MoE holds 4x the MLP weights).
Runs: dense; MoE; MoE with R2; MoE with R3. Per run, the mean of each phase over the steps after the first
(timing_s/*), the mean response length and tokens per second (random weights sample different lengths:
compare per token), and the weights a push carries (the model file's bytes: fp32, every tensor). R3's routing
data is rows x sequence x MoE layers x top-k bytes (uint8) beside the tokens.
"""

import argparse
import pathlib
import statistics
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from meshrl.tiny.arithmetic import ArithmeticConfig, make_data  # noqa: E402
from meshrl.tiny.models import TinyModelConfig, make_model  # noqa: E402
from testkit.recipe import timed_grpo  # noqa: E402

PHASES = ("gen", "reward", "adv", "update_actor", "update_weights")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        data = make_data(work / "data", ArithmeticConfig())
        dense = make_model(work / "dense", TinyModelConfig(family="qwen3"))
        moe = make_model(work / "moe", TinyModelConfig(family="qwen3_moe", num_experts=8, experts_per_token=2))
        runs = {
            "dense qwen3": (dense, []),
            "qwen3_moe": (moe, []),
            "qwen3_moe, R2": (moe, ["actor.router_replay=r2"]),  # 4 mini-batches a step: replay matters
            "qwen3_moe, R3": (moe, ["actor.router_replay=r3"]),
        }
        print("| run | response tokens | step (s) | " + " | ".join(PHASES) + " | tokens/s | push carries (MB) |")
        print("|---|---|---|" + "---|" * len(PHASES) + "---|---|")
        for name, (model, extra) in runs.items():
            run_dir = work / name.replace(" ", "_").replace(",", "")
            rows = timed_grpo("arithmetic", run_dir, model, data["train"], args.steps, *extra)
            mean = {k: statistics.mean(r.get(f"timing_s/{k}", 0.0) for r in rows) for k in ("step", *PHASES)}
            length = statistics.mean(r["response_length/mean"] for r in rows)
            speed = statistics.mean(r["perf/tokens_per_s"] for r in rows)
            size = (model / "model.safetensors").stat().st_size / 1e6
            phases = " | ".join(f"{mean[k]:.3f}" for k in PHASES)
            print(f"| {name} | {length:.2f} | {mean['step']:.3f} | {phases} | {speed:.0f} | {size:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
