"""GRPO step benchmark on the tiny task through the full mesh (configs/arithmetic_grpo.yaml's rollout,
actor with world_size and engine auto, reward service): where a step's time goes, what the mesh's RPCs
cost, and what tracing costs.

    .venv/bin/python bench/step_bench.py [--steps 20] [--repeats 2]
    .venv/bin/python bench/step_bench.py --compare reuse|packed|world|budget|share   # one comparison only
        [--model tiny|50m]

(a) phases: each phase's share of the step (timing_s/* from metrics.jsonl, steps after the first).
(b) RPC overhead: for every call the orchestrator makes, its client span minus the service's server
    span (serialization, transport, queueing), summed per step, as a fraction of the step.
(c) tracing: median step time with tracing off and on (JSONL exporter in every process), runs
    alternated off/on `--repeats` times in this one invocation; the ratio is the cost.
"""

import argparse
import json
import pathlib
import statistics
import sys
import tempfile
from collections import defaultdict

from meshrl.tiny.arithmetic import ArithmeticConfig, make_data
from meshrl.tiny.models import TinyModelConfig, make_model
from meshrl.trace_view import load_spans
from orchestrator.config import load_config
from orchestrator.main import run


def grpo(work: pathlib.Path, name: str, model, data, steps: int, *, trace: str, extra=()) -> pathlib.Path:
    cfg = load_config(
        "configs/arithmetic_grpo.yaml",
        [
            f"actor.model={model}",
            f"data.train_files={data['train']}",
            f"trainer.run_dir={work / name}",
            f"trainer.total_steps={steps}",
            f"trainer.trace={trace}",
            "trainer.save_every=100000",
            "trainer.logger=[console]",
            *extra,
        ],
    )
    return run("grpo", cfg)


def rows(run_dir: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()][1:]  # warm-up


def phases(run_dir: pathlib.Path) -> dict[str, float]:
    r = rows(run_dir)
    step = statistics.mean(x["timing_s/step"] for x in r)
    keys = sorted({k for x in r for k in x if k.startswith("timing_s/") and k != "timing_s/step"})
    return {"step": step, **{k.removeprefix("timing_s/"): statistics.mean(x.get(k, 0.0) for x in r) for k in keys}}


def rpc_overhead(run_dir: pathlib.Path) -> tuple[float, dict[str, float]]:
    """(overhead / step time, mean overhead per method in seconds) over the traced steps after the first."""
    spans = load_spans(run_dir)
    steps = {s["trace_id"]: s for s in spans if s["name"] == "step" and s["attributes"]["meshrl.step"] > 1}
    server_of = {s["parent_id"]: s for s in spans if s["kind"] == "SERVER"}
    per_method, total = defaultdict(list), 0.0
    for s in spans:
        if s["kind"] == "CLIENT" and s["service"] == "meshrl-orchestrator" and s["trace_id"] in steps:
            server = server_of.get(s["span_id"])
            if server is not None:
                gap = ((s["end_ns"] - s["start_ns"]) - (server["end_ns"] - server["start_ns"])) / 1e9
                per_method[s["name"]].append(gap)
                total += gap
    step_time = sum((s["end_ns"] - s["start_ns"]) / 1e9 for s in steps.values())
    return total / step_time, {m: statistics.mean(v) for m, v in per_method.items()}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--compare", choices=("tracing", *VARIANTS), default="tracing")
    p.add_argument("--model", choices=list(MODELS), default="tiny")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        config, extra = MODELS[args.model]
        model = make_model(work / "model", config)
        data = make_data(work / "data", ArithmeticConfig(num_train=2000, num_test=100, ops="+", max_operand=20))
        if args.compare in VARIANTS:
            return compare(work, model, data, args.steps, args.repeats, which=args.compare, base_extra=extra)
        times: dict[str, list[float]] = {"": [], "jsonl": []}
        last_traced = None
        for i in range(args.repeats):
            for trace in ("", "jsonl"):
                run_dir = grpo(work, f"{trace or 'off'}-{i}", model, data, args.steps, trace=trace)
                times[trace] += [x["timing_s/step"] for x in rows(run_dir)]
                if trace:
                    last_traced = run_dir
        assert last_traced is not None, "--repeats must be >= 1"
        ph = phases(last_traced)
        frac, per_method = rpc_overhead(last_traced)
    print(f"\n(a) one GRPO step by phase (mean of steps 2..{args.steps}, traced run):")
    print("| phase | seconds | share of step |\n|---|---|---|")
    for k, v in ph.items():
        if k != "step":
            print(f"| {k} | {v:.3f} | {v / ph['step']:.1%} |")
    print(f"| step | {ph['step']:.3f} | 100% |")
    print(f"\n(b) mesh RPC overhead (client span - server span), {frac:.1%} of the step:")
    print("| call | mean overhead per call |\n|---|---|")
    for m, v in sorted(per_method.items()):
        print(f"| {m} | {v * 1000:.1f} ms |")
    off, on = statistics.median(times[""]), statistics.median(times["jsonl"])
    print(
        f"\n(c) median step time: tracing off {off:.3f} s, on {on:.3f} s, on/off = {on / off:.3f} "
        f"({len(times[''])} and {len(times['jsonl'])} steps)"
    )
    return 0


MODELS = {  # name: (model, the run's overrides)
    "tiny": (TinyModelConfig(), []),  # the main job's, at configs/arithmetic_grpo.yaml's settings
    # 50M parameters (as bench/actor_bench.py's), 4 prompts x 8 samples in 4 mini-batches: where FLOPs count
    "50m": (
        TinyModelConfig(hidden_size=640, num_layers=8, num_heads=10, num_kv_heads=5, intermediate_size=2560),
        ["data.train_batch_size=4", "actor.mini_batch_size=8"],
    ),
}
VARIANTS = {
    "reuse": {
        "a log-prob call before the update": ["actor.reuse_logprobs=false"],
        "the update finds its own (default)": ["actor.reuse_logprobs=true"],
    },
    "packed": {"padded": ["actor.padding_free=false"], "padding-free (default)": ["actor.padding_free=true"]},
    "world": {
        "2 ranks x 1 thread": ["actor.world_size=2", "actor.threads=1", "actor.engine=fsdp2"],
        "2 ranks x 2 threads": ["actor.world_size=2", "actor.threads=2", "actor.engine=fsdp2"],
        "1 rank x 2 threads": ["actor.world_size=1", "actor.threads=2", "actor.engine=fsdp2"],
    },
    "budget": {
        "fsdp2, 64-row micro-batches": [
            "actor.engine=fsdp2",
            "actor.micro_batch_tokens=0",
            "actor.micro_batch_size=64",
        ],
        "fsdp2, 4096-token micro-batches": ["actor.engine=fsdp2"],
        "plain, 4096-token micro-batches": ["actor.engine=plain"],
    },
    "share": {
        "every row its whole sequence": ["actor.share_prompts=false"],
        "a group's prompt once (default)": ["actor.share_prompts=true"],
    },
}


def compare(work: pathlib.Path, model, data, steps: int, repeats: int, *, which: str, base_extra=()) -> int:
    """Median step time of each variant, runs alternated `repeats` times in this one invocation."""
    variants = VARIANTS[which]
    times: defaultdict[str, list[float]] = defaultdict(list)
    phase: defaultdict[str, defaultdict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for i in range(repeats):
        for name, extra in variants.items():
            run_dir = grpo(
                work,
                f"{which}-{len(times)}-{i}-{name.replace(' ', '_')}",
                model,
                data,
                steps,
                trace="",
                extra=[*base_extra, *extra],
            )
            r = rows(run_dir)
            times[name] += [x["timing_s/step"] for x in r]
            for x in r:
                old, update = x.get("timing_s/old_log_prob", 0.0), x["timing_s/update_actor"]
                for k, v in (("old_log_prob", old), ("update_actor", update), ("both", old + update)):
                    phase[name][k].append(v)
    base = statistics.median(times[next(iter(variants))])
    print(f"\n({which}) median over steps 2..{steps}, {repeats} runs each:")
    print(
        "| variant | step s | x first | old_log_prob s | update_actor s | the two s | steps |\n"
        "|---|---|---|---|---|---|---|"
    )
    for name in variants:
        med = statistics.median(times[name])
        ph = {k: statistics.median(v) for k, v in phase[name].items()}
        print(
            f"| {name} | {med:.3f} | {med / base:.3f} | {ph['old_log_prob']:.3f} | {ph['update_actor']:.3f} "
            f"| {ph['both']:.3f} | {len(times[name])} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
