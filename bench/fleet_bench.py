"""The rollout fleet (issue 29): generation throughput with one and two replicas, and the time of one weight
push to 1, 2 and 4 replicas.

gen: vLLM rollout services on a 4-layer model (bench/chunks_bench.py's), each on a core of its own
(`--cpus k`, as a run gives a CPU fleet's replicas). The same prompts (--prompts x --n samples, up to
--max-new-tokens tokens) go to one replica through a Mesh; to two replicas split by hand (a half to
each, side by side, not joined: the ceiling without the fleet's cut and join); and to two replicas
through a Mesh's fleet (cut, least-loaded picks, join). Rounds alternate after a warm-up round;
samples/s is the median over the rounds.

push: an actor service (plain engine, one rank) pushes the model to R HF-backend replicas in one
PushWeights (each bucket gathered once); shm with the replicas on 127.0.0.1 (written once, read by
each), stream with each replica on an address of its own (127.0.0.2, .3, ...: one machine, so the
"hosts" share its cores and memory bandwidth), sent by the actor to each replica side by side
("stream") or down a chain in which each replica passes each bucket on to the next ("relay"). Each
replica gets its share of the cores (`--cpus`, as in a run: with R replicas each on every core, their
OpenMP threads spun against each other and a push took 0.03-0.24 s at random). Seconds are the
actor's reply's, median of --repeats after one warm-up push.

    .venv/bin/python bench/fleet_bench.py gen [--prompts 128] [--n 8] [--max-new-tokens 48] [--repeats 3]
    .venv/bin/python bench/fleet_bench.py push [--model tiny|100m] [--replicas 1 2 4] [--repeats 3]
        [--transports shm stream relay]
    .venv/bin/python bench/fleet_bench.py kill [--steps 12] [--kill-after 5] [--backend vllm]

kill: the main job's GRPO (configs/arithmetic_grpo.yaml from its SFT warm-up in runs/default, so run
`bash scripts/run.sh` once first) with rollout.replicas=2, twice: untouched, and with replica 1 killed
(SIGKILL) as soon as step --kill-after is logged. Per step: seconds, and how many replicas were up.
"""

import argparse
import concurrent.futures
import pathlib
import statistics
import sys
import tempfile
import time

from chunks_bench import MODEL
from lora_bench import param_count
from transformers import AutoTokenizer

from meshrl.hosts import share_cores
from meshrl.rpc import Client
from meshrl.tiny.arithmetic import ArithmeticConfig, make_data
from meshrl.tiny.models import TinyModelConfig, make_model
from meshrl.v1 import actor_pb2, rollout_pb2
from orchestrator.config import load_config
from orchestrator.data import PromptDataset
from orchestrator.lifecycle.mesh import Mesh
from orchestrator.lifecycle.services import launch

ROLLOUT = rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"]
ACTOR = actor_pb2.DESCRIPTOR.services_by_name["ActorService"]
MODELS = {
    "tiny": TinyModelConfig(),  # the main job's
    "100m": TinyModelConfig(hidden_size=768, num_layers=12, num_heads=12, num_kv_heads=4, intermediate_size=3072),
}


def generation(a, tmp: pathlib.Path) -> None:
    model = make_model(tmp / "model", MODEL)
    data = make_data(tmp / "data", ArithmeticConfig())
    procs, clients = [], {}
    try:
        for core, name in enumerate(["rollout", "rollout-1"]):
            proc, address = launch(
                ["rollout", "--model", str(model), "--backend", "vllm", "--max-model-len", "256", "--cpus", str(core)]
            )
            procs.append(proc)
            clients[name] = Client(address, ROLLOUT, timeout=1200)
        dataset = PromptDataset(str(data["train"]), AutoTokenizer.from_pretrained(model), 128)
        prompts = dataset.batch(list(range(a.prompts)), [f"u{i}" for i in range(a.prompts)])
        overrides = [f"rollout.n={a.n}", f"rollout.max_new_tokens={a.max_new_tokens}", "rollout.temperature=1.0"]
        one = Mesh(load_config(None, overrides), {"rollout": clients["rollout"]})
        two = Mesh(load_config(None, [*overrides, "rollout.replicas=2"]), dict(clients))
        half = a.prompts // 2

        def by_hand(seed: int) -> None:  # a half to each replica, side by side, not joined
            parts = [(prompts.slice(0, half), 0), (prompts.slice(half, a.prompts), half)]
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                futures = [
                    pool.submit(two.generate, part, seed=seed + at, replica=two.router.pick(a.n * len(part), name))
                    for (part, at), name in zip(parts, ["rollout", "rollout-1"])
                ]
                for f in futures:
                    f.result()

        ways = {
            "1 replica (Mesh)": lambda seed: one.generate(prompts, seed=seed),
            "2 replicas, split by hand": by_hand,
            "2 replicas (Mesh fleet)": lambda seed: two.generate(prompts, seed=seed),
        }
        seconds: dict[str, list[float]] = {k: [] for k in ways}
        for i in range(a.repeats + 1):
            for name, way in ways.items():
                start = time.perf_counter()
                way(100 + i)
                if i:  # the first round warms each up
                    seconds[name].append(time.perf_counter() - start)
    finally:
        for p in procs:
            p.terminate()
            p.wait(120)
    samples = a.prompts * a.n
    print(
        f"\nvLLM, {a.prompts} prompts x n={a.n}, up to {a.max_new_tokens} new tokens, a core per replica; "
        f"median of {a.repeats} rounds"
    )
    print("| | samples/s | x 1 replica | rounds (s) |")
    print("|---|---|---|---|")
    base = statistics.median(seconds["1 replica (Mesh)"])
    for name, runs in seconds.items():
        s = statistics.median(runs)
        print(f"| {name} | {samples / s:.0f} | {base / s:.2f} | {', '.join(f'{x:.2f}' for x in runs)} |")


def push(a, tmp: pathlib.Path) -> None:  # limit: one benchmark's script, read top to bottom
    model = make_model(tmp / "model", MODELS[a.model])
    largest = max(a.replicas)
    procs = []
    try:
        actor_proc, actor_address = launch(
            ["actor", "--role", "actor", "--model", str(model), "--world-size", "1", "--engine", "plain"]
            + ["--lr", "1e-5", "--checkpoint-root", str(tmp)]
        )
        procs.append(actor_proc)
        actor = Client(actor_address, ACTOR, timeout=1200)
        replicas: dict[str, list[str]] = {"shm": [], "stream": []}
        for transport, hosts in (
            ("shm", ["127.0.0.1"] * largest),
            ("stream", [f"127.0.0.{i + 2}" for i in range(largest)]),
        ):
            if transport not in {"stream" if k == "relay" else k for k in a.transports}:
                continue
            for host, cpus in zip(hosts, share_cores(largest)):
                proc, address = launch(
                    ["rollout", "--model", str(model), "--backend", "hf", "--max-model-len", "64"]
                    + ["--host", host, "--cpus", cpus]
                )
                procs.append(proc)
                replicas[transport].append(address)
        print(
            f"\npush of the {a.model} model ({param_count(model):,} parameters, fp32) to R HF-backend replicas in one "
            f"PushWeights; median of {a.repeats} after a warm-up"
        )
        print("| transport | replicas | seconds | x 1 replica |")
        print("|---|---|---|---|")
        version = 0
        for kind in a.transports:
            transport = "stream" if kind == "relay" else kind
            base = None
            for r in a.replicas:
                targets = replicas[transport][:r]
                runs = []
                for i in range(a.repeats + 1):
                    version += 1
                    reply = actor.call_message(
                        "PushWeights",
                        actor_pb2.PushWeightsRequest(
                            rollout_address=targets[0],
                            more_rollout_addresses=targets[1:],
                            transport=transport,
                            version=version,
                            relay=kind == "relay",
                            rollback=True,  # replicas left out of the last pushes are behind: any version goes
                        ),
                        actor_pb2.PushWeightsResponse,
                    )
                    assert not reply.failed, reply.failed
                    if i:
                        runs.append(reply.seconds)
                s = statistics.median(runs)
                base = base or s
                print(f"| {kind} | {r} | {s:.3f} | {s / base:.2f} |", flush=True)
    finally:
        for p in procs:
            p.terminate()
            p.wait(120)


def kill(a, tmp: pathlib.Path) -> None:
    import json
    import signal
    import subprocess

    import psutil

    default = pathlib.Path(__file__).resolve().parents[1] / "runs" / "default"
    if not (default / "sft" / "hf").is_dir():
        raise SystemExit("kill needs the main job's SFT warm-up: run `bash scripts/run.sh` once")
    runs = {}
    for name in ("untouched", "killed"):
        run_dir = tmp / name
        args = [
            sys.executable, "-m", "cli", "grpo", "--config", "configs/arithmetic_grpo.yaml",
            f"actor.model={default / 'sft' / 'hf'}", f"data.train_files={default / 'data' / 'train.parquet'}",
            f"trainer.run_dir={run_dir}", f"trainer.total_steps={a.steps}", "trainer.val_every=0",
            "trainer.save_every=0", "rollout.replicas=2", f"rollout.backend={a.backend}", "trainer.logger=[console]",
        ]  # fmt: skip
        proc = subprocess.Popen(args, cwd=default.parents[1], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        orchestrator, killed = psutil.Process(proc.pid), False
        while proc.poll() is None:
            logged = run_dir / "metrics.jsonl"
            if name == "killed" and not killed and logged.is_file():
                lines = logged.read_text().splitlines()
                if len(lines) >= a.kill_after:
                    rollouts = [
                        p for p in orchestrator.children(recursive=True) if p.cmdline()[3:5] == ["serve", "rollout"]
                    ]
                    max(rollouts, key=lambda p: p.create_time()).send_signal(signal.SIGKILL)
                    killed = True
            time.sleep(0.02)
        assert proc.returncode == 0, f"{name} run failed"
        runs[name] = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    print(f"\nGRPO, main job's settings, {a.backend} rollout x 2 replicas; replica 1 killed after step {a.kill_after}")
    print("| step | untouched (s) | killed (s) | replicas up |")
    print("|---|---|---|---|")
    for u, k in zip(runs["untouched"], runs["killed"]):
        print(f"| {k['step']} | {u['timing_s/step']:.2f} | {k['timing_s/step']:.2f} | {k['rollout/replicas_up']:.0f} |")
    total = {n: sum(r["timing_s/step"] for r in rows) for n, rows in runs.items()}
    print(f"steps' time in all: untouched {total['untouched']:.1f} s, killed {total['killed']:.1f} s")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["gen", "push", "kill"])
    ap.add_argument("--prompts", type=int, default=128)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--model", choices=list(MODELS), default="tiny")
    ap.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--transports", nargs="+", choices=["shm", "stream", "relay"], default=["shm", "stream", "relay"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--kill-after", type=int, default=5)
    ap.add_argument("--backend", default="vllm")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        {"gen": generation, "push": push, "kill": kill}[a.what](a, pathlib.Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
