"""rollout.chunks: a step's sampling (generation, then scoring) as one Generate call against C concurrent
calls, each scored as soon as it returns (issue 15's streamed groups).

A vLLM rollout service and a reward service running a user function that costs real time (math-verify,
bench/math_reward.py, ~1.6 ms a sample) on the arithmetic task; the step is orchestrator.sampling.chunks.sample
through a real Mesh, as a run calls it. The values of C alternate, after a warm-up of each; samples/s is
rows / (gen + reward) of one step, the median over the repeats. --pin puts the rollout on core 0 and the
reward service (and this process) on core 1, as a GPU rollout leaves the host's cores to scoring;
without it they share both cores.

    .venv/bin/python bench/chunks_bench.py [--prompts 64] [--n 4] [--max-new-tokens 48] [--chunks 1 4 8] [--pin]
"""

import argparse
import os
import pathlib
import statistics
import sys
import tempfile

from async_bench import pin
from transformers import AutoTokenizer

from meshrl.rpc import Client
from meshrl.tiny.arithmetic import ArithmeticConfig, make_data
from meshrl.tiny.models import TinyModelConfig, make_model
from meshrl.v1 import reward_pb2, rollout_pb2
from orchestrator.config import load_config
from orchestrator.data import PromptDataset
from orchestrator.lifecycle.mesh import Mesh
from orchestrator.lifecycle.services import launch
from orchestrator.sampling import chunks

BENCH = pathlib.Path(__file__).resolve().parent
MODEL = TinyModelConfig(hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=1024)


def main() -> int:  # limit: one benchmark's script, read top to bottom
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--chunks", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--reward-workers", type=int, default=1)
    ap.add_argument("--pin", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = make_model(pathlib.Path(tmp) / "model", MODEL)
        data = make_data(pathlib.Path(tmp) / "data", ArithmeticConfig())
        rollout, rollout_address = launch(
            ["rollout", "--model", str(model), "--backend", "vllm", "--max-model-len", "256"]
        )
        reward, reward_address = launch(
            ["reward", "--workers", str(a.reward_workers), "--function", f"{BENCH / 'math_reward.py'}:compute_score"]
        )
        try:
            if a.pin:
                pin(rollout.pid, 0)
                pin(reward.pid, 1)
                os.sched_setaffinity(0, {1})
            clients = {
                "rollout": Client(
                    rollout_address, rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"], timeout=1200
                ),
                "reward": Client(reward_address, reward_pb2.DESCRIPTOR.services_by_name["RewardService"], timeout=1200),
            }
            dataset = PromptDataset(str(data["train"]), AutoTokenizer.from_pretrained(model), 128)
            prompts = dataset.batch(list(range(a.prompts)), [f"u{i}" for i in range(a.prompts)])
            meshes = {
                c: Mesh(
                    load_config(
                        None,
                        [
                            f"rollout.n={a.n}",
                            f"rollout.max_new_tokens={a.max_new_tokens}",
                            "rollout.temperature=1.0",
                            f"rollout.chunks={c}",
                        ],
                    ),
                    clients,
                )
                for c in a.chunks
            }
            times: dict[int, list[dict[str, float]]] = {c: [] for c in a.chunks}  # seconds by phase
            for i in range(a.repeats + 1):
                for c in a.chunks:
                    _, _, seconds = chunks.sample(meshes[c], prompts, seed=100 + i)
                    if i:  # the first round warms each up
                        times[c].append(seconds)
        finally:
            for p in (rollout, reward):
                p.terminate()
                p.wait(120)
    rows = a.prompts * a.n
    print(
        f"\n{a.prompts} prompts x n={a.n}, up to {a.max_new_tokens} new tokens, math-verify reward "
        f"({a.reward_workers} worker); median of {a.repeats}; {'pinned' if a.pin else 'sharing both cores'}"
    )
    print("| chunks | samples/s | x chunks=1 | gen | reward after the last call |")
    print("|---|---|---|---|---|")
    base = None
    for c, runs in times.items():
        total = statistics.median(s["gen"] + s["reward"] for s in runs)
        base = base or total
        print(
            f"| {c} | {rows / total:.0f} | {base / total:.2f} | {statistics.median(s['gen'] for s in runs):.3f} s | "
            f"{statistics.median(s['reward'] for s in runs):.3f} s |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
