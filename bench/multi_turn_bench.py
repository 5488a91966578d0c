"""Multi-turn rollouts with a slow tool: trajectories/s playing a batch's episodes side by side
(rollout.concurrency=64, their turns batched into few Generate calls) against one episode at a time
(rollout.concurrency=1) - issue 16's benchmark.

The tool sleeps a random 0-200 ms per call (bench/sleepy_env.py, 3 turns an episode, 2 calls answered
with an observation); the rollout is the HF backend on the main job's tiny model, the environment our
env service, each in its own process. Median of --repeats, the settings alternated after a warm-up.

    .venv/bin/python bench/multi_turn_bench.py [--prompts 16] [--n 4] [--repeats 3]
"""

import argparse
import pathlib
import statistics
import sys
import tempfile
import time

from transformers import AutoTokenizer

from meshrl.rpc import Client
from meshrl.tiny.arithmetic import ArithmeticConfig, make_data
from meshrl.tiny.models import TinyModelConfig, make_model
from meshrl.v1 import env_pb2, rollout_pb2
from orchestrator.config import load_config
from orchestrator.data import PromptDataset
from orchestrator.lifecycle.mesh import Mesh
from orchestrator.lifecycle.services import launch
from orchestrator.sampling import multi_turn

BENCH = pathlib.Path(__file__).resolve().parent


def main() -> int:  # limit: one benchmark's script, read top to bottom
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--backend", default="hf", choices=["hf", "vllm"])
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = make_model(pathlib.Path(tmp) / "model", TinyModelConfig())
        data = make_data(pathlib.Path(tmp) / "data", ArithmeticConfig())
        rollout, rollout_address = launch(
            ["rollout", "--model", str(model), "--backend", a.backend, "--max-model-len", "256"]
        )
        env, env_address = launch(["env", "--module", f"{BENCH / 'sleepy_env.py'}:Sleepy", "--workers", "128"])
        try:
            clients = {
                "rollout": Client(
                    rollout_address, rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"], timeout=1200
                ),
                "env": Client(env_address, env_pb2.DESCRIPTOR.services_by_name["EnvService"], timeout=1200),
            }
            tokenizer = AutoTokenizer.from_pretrained(model)
            prompts = PromptDataset(str(data["train"]), tokenizer, 64).batch(
                list(range(a.prompts)), [f"u{i}" for i in range(a.prompts)]
            )
            settings = {"one at a time": 1, "side by side": 64}
            meshes = {}
            for name, c in settings.items():
                meshes[name] = Mesh(
                    load_config(
                        None,
                        [
                            f"rollout.n={a.n}",
                            "rollout.max_new_tokens=8",
                            "rollout.multi_turn=true",
                            "rollout.max_turns=3",
                            "rollout.max_response_tokens=96",
                            f"rollout.concurrency={c}",
                            "rollout.temperature=1.0",
                        ],
                    ),
                    clients,
                )
            times: dict[str, list[float]] = {name: [] for name in settings}
            for i in range(a.repeats + 1):
                for name, mesh in meshes.items():
                    start = time.perf_counter()
                    gen, _, _ = multi_turn.sample(mesh, prompts, seed=i, tokenizer=tokenizer)
                    assert list(gen.non_tensor_batch["turns"]) == [3] * len(gen)
                    if i:
                        times[name].append(time.perf_counter() - start)
        finally:
            for p in (rollout, env):
                p.terminate()
                p.wait(120)
    rows = a.prompts * a.n
    print(
        f"\n{rows} trajectories of 3 turns, a tool sleeping 0-200 ms per call, {a.backend} rollout; "
        f"median of {a.repeats}"
    )
    print("| episodes | trajectories/s | x one at a time | batch wall time |")
    print("|---|---|---|---|")
    base = statistics.median(times["one at a time"])
    for name, t in times.items():
        print(
            f"| {name} (rollout.concurrency={settings[name]}) | {rows / statistics.median(t):.1f} | "
            f"{base / statistics.median(t):.1f} | {statistics.median(t):.2f} s |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
