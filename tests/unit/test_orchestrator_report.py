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
        {"step": 0, "val/acc/mean": 0.4},
        {"step": 1, "critic/score/mean": 0.1},
        {"step": 2, "critic/score/mean": 0.3, "val/acc/mean": 0.7},
        {"step": 3, "val/acc/mean": 0.6},
    ]
    table = summary_table(rows)
    assert "| critic/score/mean | 0.1 (1) | 0.3 (2) |" in table
    assert "| val/acc/mean | 0.4 (0) | 0.6 (3) |" in table
    assert "| best val/acc/mean | 0.7 (2) | |" in table


def test_finish_report_writes_png_and_summary(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(
        "\n".join(json.dumps({"step": s, "critic/score/mean": s / 10, "actor/pg_loss": 1 / s}) for s in range(1, 6))
    )
    assert "critic/score/mean" in finish_report(tmp_path)
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "actor/pg_loss" in (tmp_path / "summary.md").read_text()


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
