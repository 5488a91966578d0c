"""`meshrl trace RUN_DIR [--step N]`: one training step's spans, from every process, as a text timeline.

Reads RUN_DIR/traces/*.jsonl (meshrl.telemetry's JSONL exporter; one file per
process), finds the trace of the step (default: the last one traced), and
prints its spans as a tree, each with a bar placed on the step's time axis:

    step 12 (grpo)                                  1.002 s  |########################################|
      gen                          orchestrator     0.161 s  |######                                  |
        RolloutService/Generate    orchestrator     0.158 s  |######                                  |
          RolloutService/Generate  rollout          0.150 s  | #####                                  |
"""

import json
import pathlib
from collections import defaultdict

WIDTH = 40


def load_spans(run_dir: str | pathlib.Path) -> list[dict]:
    folder = pathlib.Path(run_dir) / "traces"
    files = sorted(folder.glob("*.jsonl")) if folder.is_dir() else []
    if not files:
        raise ValueError(f"no traces in {folder}: run with trainer.trace=jsonl (the default)")
    spans = []
    for f in files:
        for line in f.read_text().splitlines():
            if line.strip():
                try:
                    spans.append(json.loads(line))
                except json.JSONDecodeError:
                    continue  # a line cut short by a killed process
    return spans


def step_traces(spans: list[dict]) -> dict[int, dict]:
    """step number -> its root span (the orchestrator's "step" span)."""
    return {
        s["attributes"]["meshrl.step"]: s
        for s in spans
        if s["name"] == "step" and "meshrl.step" in s.get("attributes", {})
    }


def timeline(spans: list[dict], step: int | None = None) -> str:
    roots = step_traces(spans)
    if not roots:
        raise ValueError("the traces hold no training step (is the run's orchestrator trace there?)")
    if step is None:
        step = max(roots)
    if step not in roots:
        raise ValueError(f"no trace for step {step}; traced steps: {min(roots)}..{max(roots)}")
    root = roots[step]
    members = [s for s in spans if s["trace_id"] == root["trace_id"]]
    children = defaultdict(list)
    for s in members:
        children[s["parent_id"]].append(s)
    t0, t1 = root["start_ns"], root["end_ns"]
    total = max(1, t1 - t0)
    name_width = max(len(s["name"]) + 2 * depth for s, depth in _walk(root, children)) + 2
    lines = [
        f"trace {root['trace_id']}: step {step} ({root['attributes'].get('meshrl.algorithm', '')}), "
        f"{len(members)} spans from {len({s['service'] for s in members})} processes"
    ]
    for s, depth in _walk(root, children):
        a = int((s["start_ns"] - t0) / total * WIDTH)
        b = max(a + 1, int((s["end_ns"] - t0) / total * WIDTH))
        bar = " " * a + "#" * (min(b, WIDTH) - a) + " " * (WIDTH - min(b, WIDTH))
        label = ("  " * depth + s["name"]).ljust(name_width)
        service = s["service"].removeprefix("meshrl-")
        lines.append(f"{label} {service:<13} {(s['end_ns'] - s['start_ns']) / 1e9:8.3f} s  |{bar}|")
    return "\n".join(lines)


def _walk(span: dict, children: dict, depth: int = 0):
    yield span, depth
    for child in sorted(children.get(span["span_id"], []), key=lambda s: s["start_ns"]):
        yield from _walk(child, children, depth + 1)


def main(run_dir: str, step: int | None = None) -> int:
    print(timeline(load_spans(run_dir), step))
    return 0
