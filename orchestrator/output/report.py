"""What a run leaves to look at at the end: curves.png (the main curves) and summary.md (first and
last values, best validation, the held-out gain with its standard error), from metrics.jsonl and
val.jsonl (orchestrator.output.loggers writes them as the run goes).

    finish_report(run_dir)   # reads the files, so it also works on a resumed run's whole history
    held_out_gain(run_dir)   # first vs last validation, problem by problem
"""

import json
import logging
import math
import pathlib

log = logging.getLogger(__name__)

# Panels of curves.png: per panel, the first name whose values move (a flat line says nothing: on an
# on-policy step actor/ppo_kl is 0 by construction), else the first present.
CURVES = [
    ("reward", ["critic/score/mean"]),
    ("held-out accuracy", ["val/acc/mean", "val/score/mean"]),
    ("policy loss", ["actor/pg_loss", "actor/dpo_loss", "actor/sft_loss"]),
    ("KL / clip", ["actor/ppo_kl", "actor/pg_clipfrac", "rollout/kl_to_actor", "actor/kl_loss"]),
    ("value loss", ["critic/vf_loss"]),
    ("response length", ["response_length/mean"]),
    ("turns per episode", ["multi_turn/turns/mean"]),
    ("tool calls per episode", ["multi_turn/tool_calls/mean"]),
]
SUMMARY_KEYS = [
    "critic/score/mean",
    "critic/acc/mean",
    "val/acc/mean",
    "val/score/mean",
    "actor/pg_loss",
    "actor/dpo_loss",
    "actor/sft_loss",
    "critic/vf_loss",
    "response_length/mean",
    "perf/tokens_per_s",
    "timing_s/step",
]


def read_metrics(run_dir: pathlib.Path) -> list[dict]:
    """metrics.jsonl; where a resumed run wrote a step again, the last line for it wins."""
    by_step: dict[int, dict] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            by_step[row["step"]] = {**by_step.get(row["step"], {}), **row}
    return [by_step[s] for s in sorted(by_step)]


def standard_error(p: float, n: int) -> float:
    """Of an accuracy p measured on n problems: sqrt(p(1-p)/n)."""
    return math.sqrt(p * (1 - p) / n)


def held_out_gain(run_dir: pathlib.Path) -> dict | None:
    """Greedy held-out accuracy at the first and the last validation, each with its standard error, and
    the gain with the standard error of a paired difference: both readings score the same problems, so
    the per-problem change (-1, 0, +1) is what varies. None: fewer than two validations."""
    path = run_dir / "val.jsonl"
    if not path.is_file():
        return None
    by_step = {}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            by_step[row["step"]] = [c == "1" for c in row["correct"]]
    steps = sorted(by_step)
    if len(steps) < 2 or len(by_step[steps[0]]) != len(by_step[steps[-1]]) or not by_step[steps[0]]:
        return None
    before, after = by_step[steps[0]], by_step[steps[-1]]
    n = len(before)
    p0, p1 = sum(before) / n, sum(after) / n
    diffs = [int(b) - int(a) for a, b in zip(before, after)]
    var = sum((d - (p1 - p0)) ** 2 for d in diffs) / max(1, n - 1)
    return {
        "n": n,
        "first_step": steps[0],
        "last_step": steps[-1],
        "before": p0,
        "after": p1,
        "before_se": standard_error(p0, n),
        "after_se": standard_error(p1, n),
        "gain": p1 - p0,
        "gain_se": math.sqrt(var / n),
    }


def gain_line(g: dict) -> str:
    wide = f"{g['gain'] / g['gain_se']:.1f} standard errors; " if g["gain_se"] else ""  # 0: no problem changed
    return (
        f"held-out greedy accuracy {g['before']:.3f} ± {g['before_se']:.3f} (step {g['first_step']}) -> "
        f"{g['after']:.3f} ± {g['after_se']:.3f} (step {g['last_step']}): {100 * g['gain']:+.1f} ± "
        f"{100 * g['gain_se']:.1f} points ({wide}n = {g['n']}; ± one standard error)"
    )


def series(rows: list[dict], key: str) -> list[tuple[int, float]]:
    return [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]


def choose_panels(rows: list[dict]) -> list[tuple[str, str]]:
    """(title, metric) of each panel the run has something to show in (CURVES)."""
    panels = []
    for title, keys in CURVES:
        present = [k for k in keys if series(rows, k)]
        moving = [k for k in present if len({round(v, 12) for _, v in series(rows, k)}) > 1]
        if present:
            panels.append((title, (moving or present)[0]))
    return panels


def plot_curves(rows: list[dict], path: pathlib.Path) -> bool:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers
    import matplotlib.pyplot as plt

    panels = choose_panels(rows)
    if not panels:
        return False
    cols = min(3, len(panels))
    nrows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.2 * nrows), squeeze=False)
    for ax, (title, key) in zip(axes.flat, panels):
        xs, ys = zip(*series(rows, key))
        ax.plot(xs, ys, marker="o" if len(xs) < 20 else None, markersize=3)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylabel(key, fontsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def summary_table(rows: list[dict]) -> str:
    """Markdown: each key metric's first and last value (and the best held-out accuracy)."""
    lines = ["| metric | first (step) | last (step) |", "|---|---|---|"]
    present = {k for r in rows for k in r}
    extra_val = sorted(k for k in present if k.startswith("val/") and k not in SUMMARY_KEYS)  # mean@k, best@k
    for key in SUMMARY_KEYS + extra_val:
        s = series(rows, key)
        if s:
            (s0, v0), (s1, v1) = s[0], s[-1]
            lines.append(f"| {key} | {v0:.4g} ({s0}) | {v1:.4g} ({s1}) |")
    val = series(rows, "val/acc/mean")
    if val:
        step, best = max(val, key=lambda x: x[1])
        lines.append(f"| best val/acc/mean | {best:.4g} ({step}) | |")
    return "\n".join(lines)


def finish_report(run_dir: pathlib.Path) -> str:
    """Write curves.png and summary.md into the run folder; returns the summary table."""
    rows = read_metrics(run_dir)
    if not rows:
        return ""
    table = summary_table(rows)
    gain = held_out_gain(run_dir)
    if gain:
        table += f"\n\n{gain_line(gain)}"
    (run_dir / "summary.md").write_text(f"# {run_dir.name}: {len(rows)} logged steps\n\n{table}\n")
    if plot_curves(rows, run_dir / "curves.png"):
        log.info("curves: %s", run_dir / "curves.png")
    return table
