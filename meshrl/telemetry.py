"""OpenTelemetry for every meshrl process: tracer set-up, exporters, and trace context in gRPC metadata.

Configured by environment, so the services a run starts (or compose / Ray) inherit it:
  MESHRL_TRACE=jsonl,console   exporters: `jsonl` writes MESHRL_TRACE_DIR/<service>-<pid>.jsonl
                               (one span per line), `console` prints spans to stderr
  OTEL_EXPORTER_OTLP_ENDPOINT  also export over OTLP/gRPC (e.g. http://collector:4317)
Nothing set: no provider is installed and every span is the API's no-op.

Spans leave through a BatchSpanProcessor: exporting happens on a background
thread with a short timeout, so an unreachable collector drops spans, never
blocks a training step.

    setup("meshrl-actor")                    # once per process (run_service and the trainer call it)
    with span("gen", rows=64): ...           # a span, current for the block
    metadata = inject(metadata)              # client side: carry the context
    ctx = extract(invocation_metadata)       # server side: continue it
"""

import contextlib
import json
import logging
import os
import pathlib
import threading
from collections.abc import Callable
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace

log = logging.getLogger(__name__)
TRACER = "meshrl"
# This module's own providers rather than OpenTelemetry's global ones (which can be set only once per
# process): a process that runs several trainings (tests, notebooks) sets up and shuts down each time.
_provider = None
_meter_provider = None
_instruments = None
_lock = threading.Lock()


class JsonlSpanExporter:
    """One compact JSON object per finished span, appended to a file (what `meshrl trace` reads)."""

    def __init__(self, path: str | pathlib.Path):
        self.path = pathlib.Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(self.path, "a")

    def export(self, spans):
        from opentelemetry.sdk.trace.export import SpanExportResult

        for s in spans:
            parent = s.parent.span_id if s.parent is not None else None
            self.file.write(
                json.dumps(
                    {
                        "name": s.name,
                        "trace_id": f"{s.context.trace_id:032x}",
                        "span_id": f"{s.context.span_id:016x}",
                        "parent_id": f"{parent:016x}" if parent else None,
                        "start_ns": s.start_time,
                        "end_ns": s.end_time,
                        "kind": s.kind.name,
                        "service": s.resource.attributes.get("service.name", ""),
                        "status": s.status.status_code.name,
                        "attributes": dict(s.attributes or {}),
                    }
                )
                + "\n"
            )
        self.file.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self):
        self.file.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self.file.flush()
        return True


def exporters_from_env() -> list[tuple[str, Callable[[str], Any]]]:
    """(name, make(service) -> span exporter) for each exporter the environment asks for (see the module
    docstring); JsonlSpanExporter has the SpanExporter methods without the SDK's base class."""
    names = [n.strip() for n in os.environ.get("MESHRL_TRACE", "").split(",") if n.strip()]
    unknown = sorted(set(names) - {"jsonl", "console"})
    if unknown:
        raise ValueError(f"MESHRL_TRACE: unknown exporter(s) {unknown}; known: jsonl, console")
    out: list[tuple[str, Callable[[str], Any]]] = []
    if "jsonl" in names:
        directory = os.environ.get("MESHRL_TRACE_DIR", "traces")
        out.append(
            ("jsonl", lambda service: JsonlSpanExporter(pathlib.Path(directory) / f"{service}-{os.getpid()}.jsonl"))
        )
    if "console" in names:
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        out.append(("console", lambda service: ConsoleSpanExporter(service_name=service)))
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        # a short timeout: a collector that is down costs a dropped batch, not a stalled run
        out.append(("otlp", lambda service: OTLPSpanExporter(timeout=2)))
    return out


def setup(service: str) -> bool:
    """Install a tracer provider for this process if the environment asks for one; True if it did."""
    global _provider
    with _lock:
        if _provider is not None:
            return True
        exporters = exporters_from_env()
        if not exporters:
            return False
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider = TracerProvider(resource=Resource.create({"service.name": service}))
        for _, make in exporters:
            provider.add_span_processor(
                BatchSpanProcessor(make(service), schedule_delay_millis=500, export_timeout_millis=2000)
            )
        _provider = provider
        _setup_metrics(service, [n for n, _ in exporters])
        log.info("tracing %s to %s", service, ", ".join(n for n, _ in exporters))
        return True


def _setup_metrics(service: str, exporters: list[str]) -> None:
    """Step and phase timings as OpenTelemetry metrics, to the console and/or OTLP (the JSONL
    record of every metric is the run's metrics.jsonl)."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource

    readers = []
    if "console" in exporters:
        readers.append(PeriodicExportingMetricReader(ConsoleMetricExporter(), export_interval_millis=30000))
    if "otlp" in exporters:
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

        readers.append(
            PeriodicExportingMetricReader(
                OTLPMetricExporter(timeout=2), export_interval_millis=10000, export_timeout_millis=2000
            )
        )
    global _meter_provider
    if readers:
        _meter_provider = MeterProvider(resource=Resource.create({"service.name": service}), metric_readers=readers)


def record_step(values: dict[str, float]) -> None:
    """A finished step's timings (timing_s/<phase>) and throughput as OpenTelemetry metrics."""
    global _instruments
    if _meter_provider is None:
        return
    if _instruments is None:
        meter = _meter_provider.get_meter(TRACER)
        _instruments = (
            meter.create_histogram("meshrl.phase.duration", unit="s", description="time per phase"),
            meter.create_gauge("meshrl.tokens_per_second", unit="1/s", description="response tokens/s"),
        )
    phase, tokens = _instruments
    for key, value in values.items():
        if key.startswith("timing_s/"):
            phase.record(value, {"phase": key.removeprefix("timing_s/")})
    if "perf/tokens_per_s" in values:
        tokens.set(values["perf/tokens_per_s"])


def enabled() -> bool:
    return _provider is not None


def shutdown() -> None:
    """Flush and close the exporters (bounded by their timeouts)."""
    global _provider, _meter_provider, _instruments
    with _lock:
        for provider in (_provider, _meter_provider):
            if provider is not None:
                provider.shutdown()
        _provider = _meter_provider = _instruments = None


def tracer():
    return _provider.get_tracer(TRACER) if _provider is not None else trace.NoOpTracer()


@contextlib.contextmanager
def span(name: str, kind=trace.SpanKind.INTERNAL, context=None, **attributes):
    with tracer().start_as_current_span(
        name, context=context, kind=kind, attributes={f"meshrl.{k}": v for k, v in attributes.items() if v is not None}
    ) as s:
        yield s


def inject(metadata: tuple = ()) -> tuple:
    """gRPC metadata plus the current trace context (W3C traceparent), if any."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return tuple(metadata) + tuple(carrier.items())


def extract(invocation_metadata) -> otel_context.Context:
    return propagate.extract({k: v for k, v in (invocation_metadata or ()) if isinstance(v, str)})
