"""`meshrl trace`: a step done more than once shows which attempt is on screen and lists them all
(--attempt picks one); the step's validation and checkpoint (traces of their own) are shown with it."""

import json

import pytest

from cli.main import main
from meshrl.trace_view import attempts, load_spans, timeline

S = 1_000_000_000  # ns


def span(name, trace, start, end, *, parent=None, service="meshrl-orchestrator", status="UNSET", **attributes):
    return {
        "name": name,
        "trace_id": trace,
        "span_id": f"{name}-{trace}",
        "parent_id": parent,
        "start_ns": start * S,
        "end_ns": end * S,
        "kind": "INTERNAL",
        "service": service,
        "status": status,
        "attributes": {f"meshrl.{k}": v for k, v in attributes.items()},
    }


@pytest.fixture
def run_dir(tmp_path):
    """Step 0's validation, step 1 and its validation (a span without a step number), step 2 failed once
    (a lost rollout) and done again with its validation and checkpoint; the rollout's spans in another
    process's file, a second orchestrator file as a resumed run would leave."""
    first = [
        span("validate", "v0", 100, 102),
        span("step", "s1", 103, 105, step=1, algorithm="grpo"),
        span("gen", "s1", 103, 104, parent="step-s1"),
        span("validate", "v1", 105, 106),
        span("step", "s2a", 107, 108, step=2, algorithm="grpo", status="ERROR"),
        span("RolloutService/Generate", "s2a", 107, 108, parent="step-s2a"),
    ]
    second = [
        span("step", "s2b", 110, 114, step=2, algorithm="grpo"),
        span("gen", "s2b", 110, 112, parent="step-s2b"),
        span("validate", "v2", 114, 116, step=2),
        span("checkpoint", "c2", 116, 117, step=2),
    ]
    rollout = [span("RolloutService/Generate", "s2b", 110, 112, parent="gen-s2b", service="meshrl-rollout")]
    (tmp_path / "traces").mkdir()
    for name, spans in [
        ("orchestrator-9.jsonl", first),
        ("orchestrator-10.jsonl", second),
        ("rollout-3.jsonl", rollout),
    ]:
        (tmp_path / "traces" / name).write_text("".join(json.dumps(s) + "\n" for s in spans))
    return tmp_path


def test_a_step_done_twice_says_which_attempt_is_shown_and_lists_both(run_dir):
    spans = load_spans(run_dir)
    assert [[r["trace_id"] for r in t] for t in attempts(spans)[2]] == [["s2a"], ["s2b", "v2", "c2"]]
    out = timeline(spans)  # the last step, its last attempt
    assert out.splitlines()[0].startswith("step 2 (grpo), attempt 2 of 2 (the last")
    assert "--attempt K" in out
    assert "  attempt 1  " in out and "error in step" in out and "  attempt 2  " in out
    names = [line.split()[0] for line in out.splitlines()[4:]]
    assert names == ["step", "gen", "RolloutService/Generate", "validate", "checkpoint"]
    first = timeline(spans, 2, attempt=1)
    assert "attempt 1 of 2" in first and "validate" not in first.split("traces:")[1]
    with pytest.raises(ValueError, match="step 2 was attempted 2 time"):
        timeline(spans, 2, attempt=3)


def test_validation_without_a_step_number_belongs_to_the_step_before_it(run_dir):
    spans = load_spans(run_dir)
    one = timeline(spans, 1)
    assert "attempt" not in one and [line.split()[0] for line in one.splitlines()[2:]] == ["step", "gen", "validate"]
    zero = timeline(spans, 0)  # the validation before the first step
    assert zero.splitlines()[0].startswith("step 0:") and zero.splitlines()[-1].startswith("validate")


def test_cli_trace_picks_an_attempt(run_dir, capsys):
    assert main(["trace", str(run_dir), "--step", "2", "--attempt", "1"]) == 0
    assert "attempt 1 of 2" in capsys.readouterr().out
    assert main(["trace", str(run_dir), "--step", "2", "--attempt", "5"]) == 1
    assert "--attempt 1..2" in capsys.readouterr().err


def test_validation_is_a_span_of_its_own_with_its_step(tmp_path, monkeypatch):
    from types import SimpleNamespace

    import torch

    from meshrl import telemetry
    from orchestrator.config import Config
    from orchestrator.run import validation

    class HeldOut:
        def __len__(self):
            return 2

        def batch(self, indices, uids):
            return indices

    scored = SimpleNamespace(scores=torch.tensor([1.0, 0.0]), columns={"acc": [True, False]})
    monkeypatch.setattr(validation, "answers", lambda mesh, tokenizer, prompts, **kw: scored)
    monkeypatch.setenv("MESHRL_TRACE", "jsonl")
    monkeypatch.setenv("MESHRL_TRACE_DIR", str(tmp_path / "traces"))
    telemetry.shutdown()  # this module's provider, set up afresh for this test
    assert telemetry.setup("meshrl-orchestrator")
    try:
        metrics, correct = validation.validate(Config(), None, None, HeldOut(), step=3)
    finally:
        telemetry.shutdown()
    assert metrics["val/acc/mean"] == 0.5 and correct == [True, False]
    (held_out,) = [s for s in load_spans(tmp_path) if s["name"] == "validate"]
    assert held_out["parent_id"] is None and held_out["attributes"] == {"meshrl.step": 3, "meshrl.prompts": 2}
