"""Server interceptors: errors -> status codes (the one place), the bearer-token check, and a
server span per call that continues the caller's trace (when tracing is on)."""

import hmac
import logging
import threading
import time

import grpc

from meshrl import telemetry
from meshrl.errors import details_for, status_for
from meshrl.tls import POLICY, caller_role

log = logging.getLogger(__name__)

HEALTH_PREFIX = "/grpc.health.v1.Health/"


def _wrap(handler: grpc.RpcMethodHandler, wrap) -> grpc.RpcMethodHandler:
    """The same kind of handler with its behavior passed through wrap(behavior, response_streaming)."""
    if handler is None:
        return None
    kinds = [
        ("unary_unary", grpc.unary_unary_rpc_method_handler),
        ("unary_stream", grpc.unary_stream_rpc_method_handler),
        ("stream_unary", grpc.stream_unary_rpc_method_handler),
        ("stream_stream", grpc.stream_stream_rpc_method_handler),
    ]
    for attr, make in kinds:
        behavior = getattr(handler, attr)
        if behavior is not None:
            return make(
                wrap(behavior, handler.response_streaming),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
    return handler


def short_name(method: str) -> str:
    """ "/meshrl.v1.RolloutService/Generate" -> "RolloutService/Generate"."""
    service, name = method.rsplit("/", 2)[-2:]
    return f"{service.rsplit('.', 1)[-1]}/{name}"


def _guarded(handler: grpc.RpcMethodHandler, enter, leave=None) -> grpc.RpcMethodHandler:
    """The handler with enter(context) before its behavior (which may abort the call) and leave() after."""

    def wrap(behavior, streaming):
        if streaming:

            def guarded_stream(request, context):
                enter(context)
                try:
                    yield from behavior(request, context)
                finally:
                    if leave:
                        leave()

            return guarded_stream

        def guarded(request, context):
            enter(context)
            try:
                return behavior(request, context)
            finally:
                if leave:
                    leave()

        return guarded

    return _wrap(handler, wrap)


def _abort(context: grpc.ServicerContext, error: Exception, method: str):
    if not context.is_active():
        # The caller cancelled or its deadline passed (Ctrl-C, a retry): nobody reads a status now. An
        # abort ends the call without grpc's own ERROR log of the exception.
        log.info("%s: the caller went away (%s)", method, type(error).__name__)
        context.abort(grpc.StatusCode.CANCELLED, "the caller went away")
    if context.code() not in (None, grpc.StatusCode.OK):  # type: ignore[attr-defined]  # not in the stubs
        raise error  # the method already aborted with a status of its own
    code = status_for(error)
    internal = code == grpc.StatusCode.INTERNAL
    details = details_for(error, internal)
    if internal:
        log.exception("%s failed", method)
    else:
        log.info("%s: %s: %s", method, code.name, details)
    context.abort(code, details)


class ErrorInterceptor(grpc.ServerInterceptor):
    """Turns exceptions from any method into gRPC statuses; the server stays up."""

    def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method

        def wrap(behavior, streaming):
            if streaming:

                def guarded_stream(request, context):
                    try:
                        yield from behavior(request, context)
                    except Exception as e:  # noqa: BLE001 - mapped to a status, never lost
                        _abort(context, e, method)

                return guarded_stream

            def guarded(request, context):
                try:
                    return behavior(request, context)
                except Exception as e:  # noqa: BLE001
                    _abort(context, e, method)

            return guarded

        return _wrap(continuation(handler_call_details), wrap)


class TokenInterceptor(grpc.ServerInterceptor):
    """Requires `authorization: Bearer <token>` metadata on every call but health checks."""

    def __init__(self, token: str):
        self.expected = f"Bearer {token}".encode()

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler_call_details.method.startswith(HEALTH_PREFIX):
            return handler
        metadata = dict(handler_call_details.invocation_metadata or ())
        given = metadata.get("authorization", "")
        if hmac.compare_digest(given.encode() if isinstance(given, str) else given, self.expected):
            return handler

        def wrap(behavior, streaming):
            def deny(request, context):
                context.abort(
                    grpc.StatusCode.UNAUTHENTICATED,
                    "missing or wrong bearer token (metadata 'authorization: Bearer ...')",
                )

            return deny

        return _wrap(handler, wrap)


LIGHT = (HEALTH_PREFIX, "/grpc.reflection.")  # and every service's Describe: answered from the reserve


def light(method: str) -> bool:
    return method.startswith(LIGHT) or method.endswith("/Describe")


RETRY_AFTER = "retry-after-ms"  # trailing metadata of a capacity refusal: when to try again (meshrl.rpc.Client)
MAX_HINT = 5.0  # seconds: a hint past this is a guess, and a retry then only costs one quick refusal


class CapacityInterceptor(grpc.ServerInterceptor):
    """At most `limit` work calls at once; up to `queue` more wait (in order, at most `wait` seconds or
    the call's deadline) for a slot; past that a call is RESOURCE_EXHAUSTED with a retry-after hint.
    Refusing at once cost goodput under load (issue 27: with 100 clients 97.5% were refused, 54 ok
    calls/s against 377/s when calls queued); an unbounded queue would hold threads and callers for
    ever. The server's pool has threads for running and waiting calls and more, so health checks,
    reflection and Describe always find one: 16 calls stalled on a dead peer once made every health
    check time out."""

    def __init__(self, limit: int, queue: int, wait: float):
        self.limit, self.queue, self.wait = limit, queue, wait
        self.running, self.waiting = 0, 0
        self.cond = threading.Condition()
        self.call_seconds = 0.1  # moving average of how long a work call holds its slot, for the hint

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if light(handler_call_details.method):
            return handler
        started = []

        def enter(context):
            self._acquire(context)
            started.append(time.monotonic())

        def leave():
            with self.cond:
                self.running -= 1
                self.call_seconds += 0.2 * (time.monotonic() - started[0] - self.call_seconds)
                self.cond.notify()

        return _guarded(handler, enter, leave)

    def _acquire(self, context) -> None:
        """A slot for this call, waiting in the queue when there is room; else abort with the hint."""
        with self.cond:
            if self.running < self.limit and not self.waiting:  # no overtaking the calls already waiting
                self.running += 1
                return
            if self.waiting < self.queue:
                remaining = context.time_remaining()
                deadline = time.monotonic() + min(self.wait, self.wait if remaining is None else remaining)
                self.waiting += 1
                try:
                    while self.running >= self.limit and self.cond.wait(max(0.0, deadline - time.monotonic())):
                        pass
                finally:
                    self.waiting -= 1
                if self.running < self.limit:
                    self.running += 1
                    return
            self._refuse(context)

    def _refuse(self, context) -> None:
        """RESOURCE_EXHAUSTED, with when a slot may be free: the calls waiting share `limit` slots."""
        hint_ms = round(1000 * min(MAX_HINT, max(0.05, self.call_seconds * (self.waiting + 1) / self.limit)))
        context.set_trailing_metadata(((RETRY_AFTER, str(hint_ms)),))
        context.abort(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"the service is busy: {self.running} calls in progress and {self.waiting} waiting "
            f"(its limits); retry after {hint_ms} ms",
        )


class RoleInterceptor(grpc.ServerInterceptor):
    """Under mutual TLS: PERMISSION_DENIED unless the caller's certificate names a role that meshrl.tls
    POLICY allows for the method (a token alone says nothing of the caller's role)."""

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        allowed = POLICY.get(handler_call_details.method)
        if allowed is None:
            return handler
        name = short_name(handler_call_details.method)

        def check(context):
            role = caller_role(context)
            if role not in allowed:
                context.abort(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"the {role or 'unidentified'} role may not call {name} (allowed: {sorted(allowed)})",
                )

        return _guarded(handler, check)


class TracingInterceptor(grpc.ServerInterceptor):
    """A SERVER span per call, child of the caller's span (trace context from the metadata)."""

    def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method
        if method.startswith(HEALTH_PREFIX):
            return continuation(handler_call_details)
        name = short_name(method)

        def wrap(behavior, streaming):
            def parent(context):
                return telemetry.extract(context.invocation_metadata())

            if streaming:

                def traced_stream(request, context):
                    with telemetry.span(name, telemetry.trace.SpanKind.SERVER, parent(context)):
                        yield from behavior(request, context)

                return traced_stream

            def traced(request, context):
                with telemetry.span(name, telemetry.trace.SpanKind.SERVER, parent(context)):
                    return behavior(request, context)

            return traced

        return _wrap(continuation(handler_call_details), wrap)
