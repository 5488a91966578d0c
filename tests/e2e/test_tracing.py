"""OpenTelemetry across the mesh: one trace per step, spans from the orchestrator and every service it
calls (context carried in gRPC metadata, also on the actor's weight push to the rollout), shown by
`meshrl trace`; and an unreachable OTLP collector never stalls training."""

import json
import os
import subprocess
import sys

import pytest

from meshrl import telemetry
from meshrl.trace_view import load_spans, timeline
from orchestrator.config import load_config
from orchestrator.main import run


@pytest.fixture
def traced_run(tiny_lm, arithmetic_data, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("traced")
    run(
        "grpo",
        load_config(
            None,
            [
                f"actor.model={tiny_lm}",
                f"data.train_files={arithmetic_data['train']}",
                f"trainer.run_dir={run_dir}",
                "trainer.total_steps=2",
                "data.train_batch_size=4",
                "rollout.n=2",
                "rollout.backend=hf",
                "actor.engine=plain",
                "reward.workers=1",
                "trainer.trace=jsonl",
            ],
        ),
    )
    return run_dir


def test_each_step_is_one_trace_across_every_service(traced_run):
    spans = load_spans(traced_run)
    steps = [s for s in spans if s["name"] == "step"]
    assert sorted(s["attributes"]["meshrl.step"] for s in steps) == [1, 2]
    trace = [s for s in spans if s["trace_id"] == steps[-1]["trace_id"]]
    services = {s["service"] for s in trace}
    assert {"meshrl-orchestrator", "meshrl-rollout", "meshrl-reward", "meshrl-actor"} <= services
    names = {(s["service"], s["name"], s["kind"]) for s in trace}
    for phase in ("gen", "reward", "update_actor", "update_weights"):  # old_log_prob: skipped on-policy
        assert ("meshrl-orchestrator", phase, "INTERNAL") in names
    assert ("meshrl-actor", "ActorService/Update", "SERVER") in names
    # the actor's push continues the step's trace into the rollout service
    assert ("meshrl-actor", "RolloutService/FinishWeightUpdate", "CLIENT") in names
    assert ("meshrl-rollout", "RolloutService/FinishWeightUpdate", "SERVER") in names
    by_id = {s["span_id"]: s for s in trace}
    for s in trace:  # every span hangs under the step
        while s["parent_id"] is not None:
            s = by_id[s["parent_id"]]
        assert s["name"] == "step"


def test_meshrl_trace_prints_a_timeline(traced_run):
    out = subprocess.run(
        [sys.executable, "-m", "cli", "trace", str(traced_run), "--step", "1"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "step 1 (grpo)" in out and "RolloutService/Generate" in out and "|#" in out
    with pytest.raises(ValueError, match="no trace for step 9"):
        timeline(load_spans(traced_run), 9)


def test_an_unreachable_collector_does_not_block(tmp_path, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("MESHRL_TRACE", "jsonl")
    monkeypatch.setenv("MESHRL_TRACE_DIR", str(tmp_path))
    assert telemetry.setup("meshrl-test")
    try:
        for i in range(200):  # queued for the exporters' thread, never sent inline
            with telemetry.span("work", i=i):
                pass
    finally:
        telemetry.shutdown()  # bounded by the exporter's 2 s timeout
    lines = [json.loads(x) for f in tmp_path.glob("*.jsonl") for x in f.read_text().splitlines()]
    assert len(lines) == 200  # the file exporter is unaffected by the dead collector


def test_spans_reach_an_otlp_collector(monkeypatch):
    """A stand-in collector (OTLP TraceService over gRPC, from opentelemetry-proto) receives the spans."""
    from concurrent import futures

    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

    received = []

    class Collector(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):
            received.extend(
                (rs.resource, span) for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans
            )
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Collector(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
    monkeypatch.delenv("MESHRL_TRACE", raising=False)
    try:
        assert telemetry.setup("meshrl-test")
        with telemetry.span("step", step=7):
            with telemetry.span("gen"):
                pass
        telemetry.shutdown()  # flushes
    finally:
        server.stop(None)
    names = {span.name for _, span in received}
    assert names == {"step", "gen"}
    resource, _ = received[0]
    assert any(a.key == "service.name" and a.value.string_value == "meshrl-test" for a in resource.attributes)


def test_unknown_exporter_is_named(monkeypatch):
    monkeypatch.setenv("MESHRL_TRACE", "zipkin")
    with pytest.raises(ValueError, match="zipkin"):
        telemetry.setup("meshrl-test")
    assert not telemetry.enabled() and os.environ["MESHRL_TRACE"] == "zipkin"
