"""`meshrl trace RUN_DIR [--step N] [--attempt K]`: one training step's spans, from every process, as a
text timeline.

Reads RUN_DIR/traces/*.jsonl (meshrl.telemetry's JSONL exporter; one file per process), finds the
trace of the step (default: the last one traced) and the step's validation and checkpoint (spans
"validate" and "checkpoint", traces of their own), and prints them as trees, each span with a bar
placed on one time axis:

    step 12 (grpo), attempt 2 of 2 (the last, ...; --attempt K shows another): 41 spans from 4 processes
      attempt 1  10:02:11  0.981 s  error in step
      attempt 2  10:02:19  1.302 s  ok
    traces: 5d1c... (step), 9a0e... (validate)
    step                           orchestrator     1.002 s  |##############################          |
      gen                          orchestrator     0.161 s  |#####                                   |
        RolloutService/Generate    orchestrator     0.158 s  |#####                                   |
    validate                       orchestrator     0.280 s  |                              ########  |

A step is attempted more than once when the run does it again: a retry after a lost rollout or
reward service, the steps after a checkpoint redone after a lost trained service, or a resumed run.
The last attempt (the one the run's logs keep) is shown unless --attempt picks another.
"""

import datetime
import json
import pathlib
from collections import defaultdict

WIDTH = 40
PHASES = ("validate", "checkpoint")  # spans of a step's own that the run makes outside the step's trace


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


def attempts(spans: list[dict]) -> dict[int, list[list[dict]]]:
    """step number -> its attempts in the order they ran, each a list of root spans: the orchestrator's
    "step" span, then the step's "validate" and "checkpoint" spans. A phase span without a step number
    belongs to the step last begun before it (step 0: the validation before the first step)."""
    by_start = sorted(spans, key=lambda s: s["start_ns"])
    steps = [s for s in by_start if s["name"] == "step" and "meshrl.step" in s.get("attributes", {})]
    out: dict[int, list[list[dict]]] = defaultdict(list)
    for s in steps:
        out[s["attributes"]["meshrl.step"]].append([s])
    for s in by_start:
        if s["name"] not in PHASES or s["parent_id"] is not None:
            continue
        number = s.get("attributes", {}).get("meshrl.step")
        if number is None:
            begun = [r for r in steps if r["start_ns"] <= s["start_ns"]]
            number = begun[-1]["attributes"]["meshrl.step"] if begun else 0
        tries = [t for t in out[number] if t[0]["start_ns"] <= s["start_ns"]]
        if tries and all(r["name"] != s["name"] for r in tries[-1]):
            tries[-1].append(s)
        else:  # none begun yet (step 0), or a second validation of that attempt: the step was done again
            out[number].append([s])
    return dict(out)


def timeline(spans: list[dict], step: int | None = None, attempt: int | None = None) -> str:
    """The spans of one attempt at `step` (default: the last step traced; attempt: 1-based, default the
    last) as a tree of bars, after a header that lists every attempt at the step."""
    by_step = attempts(spans)
    if not by_step:
        raise ValueError("the traces hold no training step (is the run's orchestrator trace there?)")
    if step is None:
        step = max(by_step)
    if step not in by_step:
        raise ValueError(f"no trace for step {step}; traced steps: {min(by_step)}..{max(by_step)}")
    tries = by_step[step]
    if attempt is None:
        attempt = len(tries)
    if not 1 <= attempt <= len(tries):
        raise ValueError(f"step {step} was attempted {len(tries)} time(s): --attempt 1..{len(tries)}")
    roots = tries[attempt - 1]
    traces = {r["trace_id"] for r in roots}
    members = [s for s in spans if s["trace_id"] in traces]
    children = defaultdict(list)
    for s in members:
        children[s["parent_id"]].append(s)
    t0, t1 = roots[0]["start_ns"], max(s["end_ns"] for s in members)
    total = max(1, t1 - t0)
    walk = [pair for r in roots for pair in _walk(r, children)]
    name_width = max(len(s["name"]) + 2 * depth for s, depth in walk) + 2
    algorithm = next((r["attributes"].get("meshrl.algorithm") for r in roots if r["name"] == "step"), None)
    title = f"step {step}" + (f" ({algorithm})" if algorithm else "")
    if len(tries) > 1:  # the run logged the last attempt's numbers
        title += f", attempt {attempt} of {len(tries)} " + (
            "(the last, whose numbers the run logged; --attempt K shows another)"
            if attempt == len(tries)
            else "(--attempt K shows another; the run logged the last one's numbers)"
        )
    lines = [f"{title}: {len(members)} spans from {len({s['service'] for s in members})} processes"]
    if len(tries) > 1:
        lines += [_attempt_line(i, t) for i, t in enumerate(tries, 1)]
    lines.append("traces: " + ", ".join(f"{r['trace_id']} ({r['name']})" for r in roots))
    for s, depth in walk:
        a = int((s["start_ns"] - t0) / total * WIDTH)
        b = max(a + 1, int((s["end_ns"] - t0) / total * WIDTH))
        bar = " " * a + "#" * (min(b, WIDTH) - a) + " " * (WIDTH - min(b, WIDTH))
        label = ("  " * depth + s["name"]).ljust(name_width)
        service = s["service"].removeprefix("meshrl-")
        lines.append(f"{label} {service:<13} {(s['end_ns'] - s['start_ns']) / 1e9:8.3f} s  |{bar}|")
    return "\n".join(lines)


def _attempt_line(number: int, roots: list[dict]) -> str:
    """When an attempt began, how long its spans took, and whether one of them ended in an error."""
    begun = datetime.datetime.fromtimestamp(roots[0]["start_ns"] / 1e9).strftime("%H:%M:%S")
    seconds = (max(r["end_ns"] for r in roots) - roots[0]["start_ns"]) / 1e9
    failed = [r["name"] for r in roots if r.get("status") == "ERROR"]
    return f"  attempt {number}  {begun}  {seconds:.3f} s  {'error in ' + ', '.join(failed) if failed else 'ok'}"


def _walk(span: dict, children: dict, depth: int = 0):
    yield span, depth
    for child in sorted(children.get(span["span_id"], []), key=lambda s: s["start_ns"]):
        yield from _walk(child, children, depth + 1)


def main(run_dir: str, step: int | None = None, attempt: int | None = None) -> int:
    print(timeline(load_spans(run_dir), step, attempt))
    return 0
