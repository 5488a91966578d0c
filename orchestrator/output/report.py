"""What a run leaves to look at at the end: curves.png (the main curves; held-out accuracy with a band of
one standard error) and summary.md (each training metric's mean over the first and the last few steps,
each held-out metric at the first, last and best validation, the held-out gain with its standard error),
from metrics.jsonl and val.jsonl (orchestrator.output.loggers writes them as the run goes).

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


# the band drawn around a panel's curve: ± one standard error, where the run logs one
BANDS = {"val/acc/mean": "val/acc/se"}


def choose_panels(rows: list[dict]) -> list[tuple[str, str]]:
    """(title, metric) of each panel the run has something to show in (CURVES)."""
    panels = []
    for title, keys in CURVES:
        present = [k for k in keys if series(rows, k)]
        moving = [k for k in present if len({round(v, 12) for _, v in series(rows, k)}) > 1]
        if present:
            panels.append((title, (moving or present)[0]))
    return panels


def curves_figure(rows: list[dict]):
    """The figure of curves.png (a matplotlib Figure; None: nothing to draw)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers
    import matplotlib.pyplot as plt

    panels = choose_panels(rows)
    if not panels:
        return None
    cols = min(3, len(panels))
    nrows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.2 * nrows), squeeze=False)
    for ax, (title, key) in zip(axes.flat, panels):
        xs, ys = zip(*series(rows, key))
        ax.plot(xs, ys, marker="o" if len(xs) < 20 else None, markersize=3)
        se = dict(series(rows, BANDS.get(key, "")))
        band = [(x, y - se[x], y + se[x]) for x, y in zip(xs, ys) if x in se]
        if band:  # a reading of a few hundred problems moves by a few points on its own: show how much
            bx, lo, hi = zip(*band)
            ax.fill_between(bx, lo, hi, alpha=0.25, linewidth=0, label="± 1 standard error")
            ax.legend(fontsize=7, loc="best")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylabel(key, fontsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.tight_layout()
    return fig


def plot_curves(rows: list[dict], path: pathlib.Path) -> bool:
    import matplotlib.pyplot as plt

    fig = curves_figure(rows)
    if fig is None:
        return False
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def window(num_steps: int) -> int:
    """Steps averaged at each end of the summary: a tenth of the run's logged steps, 1 to 10 (one step's
    score is the mean of one batch, too noisy to compare a run's start with its end)."""
    return max(1, min(10, num_steps // 10))


def window_mean(rows: list[dict], key: str, steps: set[int]) -> str:
    values = [(s, v) for s, v in series(rows, key) if s in steps]
    if not values:
        return ""
    first, last = values[0][0], values[-1][0]
    return f"{sum(v for _, v in values) / len(values):.4g} ({first}{'' if first == last else f'-{last}'})"


def reading(rows: list[dict], key: str, step: int, value: float) -> str:
    """A held-out value at a step, with its standard error where the run logged one."""
    se = dict(series(rows, BANDS.get(key, ""))).get(step)
    return f"{value:.4g}{'' if se is None else f' ± {se:.2g}'} (step {step})"


def summary_table(rows: list[dict]) -> str:
    """Markdown: each training metric's mean over the first and the last window() logged steps (the
    steps it covers in brackets), then each held-out metric at the first, last and best validation."""
    present = {k for r in rows for k in r}
    steps = [r["step"] for r in rows if any(k != "step" and not k.startswith("val/") for k in r)]
    w = window(len(steps))
    label = f"{w} step{'s' if w > 1 else ''}"
    lines = [f"| metric | first {label} | last {label} |", "|---|---|---|"]
    for key in [k for k in SUMMARY_KEYS if not k.startswith("val/")]:
        if series(rows, key):
            lines.append(
                f"| {key} | {window_mean(rows, key, set(steps[:w]))} | {window_mean(rows, key, set(steps[-w:]))} |"
            )
    # mean@k, best@k; a standard error is shown beside its metric
    val_keys = [k for k in SUMMARY_KEYS if k.startswith("val/")]
    val_keys += sorted(k for k in present if k.startswith("val/") and k not in val_keys and k not in BANDS.values())
    val = [(key, series(rows, key)) for key in val_keys if series(rows, key)]
    if val:  # every held-out metric reads higher-is-better: accuracy and score
        lines += ["", "| held-out metric | first validation | last validation | best |", "|---|---|---|---|"]
        for key, s in val:
            best = max(s, key=lambda x: x[1])
            lines.append(
                f"| {key} | {reading(rows, key, *s[0])} | {reading(rows, key, *s[-1])} | {reading(rows, key, *best)} |"
            )
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
