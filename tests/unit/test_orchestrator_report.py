"""The run report: metrics.jsonl read back (a resumed step's last line wins), the summary table, the curves."""

import json

from cli.main import ALGORITHMS
from orchestrator.main import LOOPS
from orchestrator.output.loggers import RunLog
from orchestrator.output.report import finish_report, gain_line, held_out_gain, read_metrics, summary_table


def test_metrics_log_appends_and_a_rewritten_step_keeps_its_last_values(tmp_path):
    with RunLog(tmp_path, []) as log:
        log.write(1, {"critic/score/mean": 0.1})
        log.write(2, {"critic/score/mean": 0.2})
    with RunLog(tmp_path, []) as log:  # a resumed run redoes step 2
        log.write(2, {"critic/score/mean": 0.25, "val/acc/mean": 0.5})
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[1] == {"step": 2, "critic/score/mean": 0.25, "val/acc/mean": 0.5}


def test_summary_names_first_last_and_best():
    rows = [
        {"step": 0, "val/acc/mean": 0.4, "val/acc/se": 0.02},
        {"step": 1, "critic/score/mean": 0.1},
        {"step": 2, "critic/score/mean": 0.3, "val/acc/mean": 0.7, "val/acc/se": 0.03},
        {"step": 3, "val/acc/mean": 0.6, "val/acc/best@4": 0.9},
    ]
    table = summary_table(rows)
    assert "| metric | first 1 step | last 1 step |" in table
    assert "| critic/score/mean | 0.1 (1) | 0.3 (2) |" in table
    assert "| held-out metric | first validation | last validation | best |" in table
    assert "| val/acc/mean | 0.4 ± 0.02 (step 0) | 0.6 (step 3) | 0.7 ± 0.03 (step 2) |" in table
    assert "| val/acc/best@4 | 0.9 (step 3) | 0.9 (step 3) | 0.9 (step 3) |" in table
    assert "val/acc/se |" not in table  # shown beside its mean, not as a metric of its own


def test_summary_compares_windows_of_steps_not_single_steps():
    """One step's score is one batch's mean: a run whose score rose from about 0.2 to about 0.5 can start
    and end on the same single-step value. The table averages a tenth of the steps at each end."""
    rows = [{"step": s, "critic/score/mean": 0.2 + 0.3 * (s > 15) + 0.1 * (s % 3 == 0)} for s in range(1, 31)]
    rows[0]["critic/score/mean"] = rows[-1]["critic/score/mean"] = 0.3164  # the same first and last step
    table = summary_table(rows)
    assert "| metric | first 3 steps | last 3 steps |" in table
    first, last = (0.3164 + 0.2 + 0.3) / 3, (0.5 + 0.5 + 0.3164) / 3
    assert f"| critic/score/mean | {first:.4g} (1-3) | {last:.4g} (28-30) |" in table
    long = [{"step": s, "timing_s/step": 1.0} for s in range(1, 501)]
    assert "| timing_s/step | 1 (1-10) | 1 (491-500) |" in summary_table(long)  # at most 10 steps


def test_finish_report_writes_png_and_summary(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(
        "\n".join(json.dumps({"step": s, "critic/score/mean": s / 10, "actor/pg_loss": 1 / s}) for s in range(1, 6))
    )
    assert "critic/score/mean" in finish_report(tmp_path)
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "actor/pg_loss" in (tmp_path / "summary.md").read_text()


def test_held_out_curve_has_a_band_of_one_standard_error(tmp_path):
    """val/acc/se is logged beside val/acc/mean: the held-out panel shades ± one standard error."""
    from orchestrator.output.report import curves_figure, plot_curves

    rows = [{"step": s, "critic/score/mean": s / 100} for s in range(1, 31)]
    for s, p in [(0, 0.40), (10, 0.52), (20, 0.57), (30, 0.64)]:
        rows.append({"step": s, "val/acc/mean": p, "val/acc/se": (p * (1 - p) / 500) ** 0.5})
    rows.sort(key=lambda r: r["step"])
    fig = curves_figure(rows)
    held_out = next(ax for ax in fig.axes if ax.get_title() == "held-out accuracy")
    (band,) = held_out.collections
    ys = band.get_paths()[0].vertices[:, 1]
    assert abs(ys.min() - (0.40 - (0.4 * 0.6 / 500) ** 0.5)) < 1e-9 and abs(ys.max() - (0.64 + 0.0215)) < 1e-3
    reward = next(ax for ax in fig.axes if ax.get_title() == "reward")
    assert not reward.collections  # no standard error logged: no band
    assert plot_curves(rows, tmp_path / "curves.png")


def test_held_out_gain_is_paired_problem_by_problem(tmp_path):
    before = [True] * 20 + [False] * 80
    after = [True] * 18 + [False] * 2 + [True] * 32 + [False] * 48  # 2 lost, 32 won: +30 points
    with RunLog(tmp_path, []) as log:
        log.write(0, {"val/acc/mean": 0.2}, before)
        log.write(5, {"critic/score/mean": 0.3})  # no validation at this step
        log.write(10, {"val/acc/mean": 0.1}, [False] * 100)
    with RunLog(tmp_path, []) as log:  # a resumed run validates step 10 again: its last reading wins
        log.write(10, {"val/acc/mean": 0.5}, after)
    g = held_out_gain(tmp_path)
    assert (g["n"], g["first_step"], g["last_step"]) == (100, 0, 10)
    assert (g["before"], g["after"]) == (0.2, 0.5) and abs(g["gain"] - 0.3) < 1e-12
    assert abs(g["before_se"] - (0.2 * 0.8 / 100) ** 0.5) < 1e-12
    diffs = [-1] * 2 + [1] * 32 + [0] * 66
    paired = (sum((d - 0.3) ** 2 for d in diffs) / 99 / 100) ** 0.5
    assert abs(g["gain_se"] - paired) < 1e-12 and paired < (g["before_se"] ** 2 + g["after_se"] ** 2) ** 0.5
    line = gain_line(g)
    assert "0.200 ± 0.040 (step 0) -> 0.500 ± 0.050 (step 10): +30.0 ± 5.0 points (6.0 standard errors" in line
    assert "held-out greedy accuracy" in finish_report(tmp_path)


def test_no_gain_without_two_validations(tmp_path):
    assert held_out_gain(tmp_path) is None
    with RunLog(tmp_path, []) as log:
        log.write(0, {"val/acc/mean": 0.2}, [True, False])
    assert held_out_gain(tmp_path) is None


def test_tensorboard_events_are_written(tmp_path):
    with RunLog(tmp_path, ["tensorboard"]) as log:
        log.write(1, {"critic/score/mean": 0.5, "bad": float("nan")})
    assert any(p.name.startswith("events.out.tfevents") for p in (tmp_path / "tensorboard").iterdir())


def test_cli_lists_exactly_the_orchestrator_loops():
    assert list(ALGORITHMS) == list(LOOPS)


def test_curves_show_what_moves_and_the_multi_turn_panels():
    """On the default on-policy path actor/ppo_kl is 0 at every step: the KL / clip panel shows the clip
    fraction (or kl_to_actor) instead; multi-turn runs get their turns and tool calls drawn."""
    from orchestrator.output.report import choose_panels

    rows = [
        {
            "step": s,
            "actor/ppo_kl": 0.0,
            "actor/pg_clipfrac": 0.01 * s,
            "multi_turn/turns/mean": 1 + s / 10,
            "multi_turn/tool_calls/mean": s / 10,
        }
        for s in range(1, 5)
    ]
    panels = dict(choose_panels(rows))
    assert panels["KL / clip"] == "actor/pg_clipfrac"
    assert panels["turns per episode"] == "multi_turn/turns/mean"
    assert panels["tool calls per episode"] == "multi_turn/tool_calls/mean"
    flat = [{"step": s, "actor/ppo_kl": 0.0} for s in range(1, 5)]
    assert dict(choose_panels(flat)) == {"KL / clip": "actor/ppo_kl"}  # nothing moves: still drawn
