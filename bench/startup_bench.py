"""Start-up: from `meshrl grpo` to its first step, with the services forked from the fork server
(cli/forkserver.py) against each started as a fresh interpreter (MESHRL_FORK_SERVER=0).

Each run is the main job's GRPO (configs/arithmetic_grpo.yaml) for 2 steps from runs/default's SFT
model, step-0 validation included, as bench/peer_bench.py measures start-up; the two variants alternate
so that a drift of the machine falls on both. Needs `bash scripts/prepare.sh runs/default` first.

    .venv/bin/python bench/startup_bench.py --repeats 3 [--backend hf|vllm] [override ...]
"""

import argparse
import os
import pathlib
import statistics
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from peer_bench import mesh  # noqa: E402  # bench/ is not a package

VARIANTS = {"fresh interpreters (MESHRL_FORK_SERVER=0)": "0", "forked (default)": "1"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--backend", default="hf", choices=["hf", "vllm"])
    p.add_argument("--run", default="runs/default", help="the folder scripts/prepare.sh wrote")
    p.add_argument("overrides", nargs="*", help="more GRPO overrides")
    args = p.parse_args()
    run = pathlib.Path(args.run)
    extra = [f"rollout.backend={args.backend}", "actor.lr=1e-4", "actor.mini_batch_size=0", *args.overrides]
    firsts: dict[str, list[float]] = {name: [] for name in VARIANTS}
    wholes: dict[str, list[float]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for name, value in VARIANTS.items():
                os.environ["MESHRL_FORK_SERVER"] = value
                r = mesh(run / "data", run / "sft" / "hf", 2, pathlib.Path(tmp) / f"{value}-{i}", *extra)
                firsts[name].append(r["first_step_at_s"])
                wholes[name].append(r["whole_s"])
                print(f"{name}: first step at {r['first_step_at_s']:.2f} s, whole {r['whole_s']:.2f} s", flush=True)
    base = statistics.median(firsts[next(iter(VARIANTS))])
    print(f"\nrollout.backend={args.backend}, {args.repeats} runs each, alternated\n")
    print("| services | first step after the command (median) | each run | x fresh | whole command (median) |")
    print("|---|---|---|---|---|")
    for name in VARIANTS:
        first = statistics.median(firsts[name])
        each = " / ".join(f"{s:.2f}" for s in firsts[name])
        print(f"| {name} | {first:.2f} s | {each} | {first / base:.2f} | {statistics.median(wholes[name]):.2f} s |")


if __name__ == "__main__":
    main()
