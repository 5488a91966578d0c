"""Client for any meshrl service: deadlines on every call, retries on UNAVAILABLE and on a busy
server's refusal (RESOURCE_EXHAUSTED with a retry-after hint), with backoff.

    reward = Client("127.0.0.1:50051", reward_pb2.DESCRIPTOR.services_by_name["RewardService"])
    reward.wait_ready(30)
    info = reward.describe()  # a common_pb2.ServiceInfo
    msg, scored = reward.call_batch("Score", Payload(reward_pb2.ScoreRequest(), batch), reward_pb2.ScoreResponse)

Methods whose messages carry a batch take and return a Payload; others take and
return the plain message. Large batches are streamed both ways automatically.

call() serves any method and returns `Payload | Message`, which a type checker cannot
see into; call_message() and call_batch() are the same call with the reply's class
named, so that what comes back is typed (and checked: a class that is not the
method's reply is a TypeError before anything is sent).
"""

import random
import time
from collections.abc import Iterable
from typing import TypeVar

import grpc
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc

from meshrl import telemetry, tls
from meshrl.codec.payload import Payload, data_field_number
from meshrl.dataproto import DataProto
from meshrl.errors import ServiceError
from meshrl.rpc.interceptors import RETRY_AFTER
from meshrl.rpc.methods import client_call, message_class, method_path
from meshrl.rpc.server import MAX_MESSAGE_BYTES, channel_options
from meshrl.rpc.token import env_token
from meshrl.v1 import common_pb2

RETRYABLE = (grpc.StatusCode.UNAVAILABLE,)
# What gRPC says when the peer answers its HTTP/2 preface in HTTP/1: "Trying to connect an http1.x server
# (HTTP status 400)" after a status line, or only the first "frame" it could not parse (Python's
# http.server answers a request it cannot read with a bare HTML page)
HTTP1_ANSWERS = ("Trying to connect an http1.x server", "Failed parsing HTTP/2")
MAX_JITTER = 5.0  # seconds: the widest random spread added to a busy server's hint
M = TypeVar("M", bound=Message)  # a reply's message class


def retry_after(error: grpc.RpcError) -> float | None:
    """The seconds a busy server's refusal asks to wait (trailing metadata); None on any other error."""
    if error.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
        return None
    trailing = getattr(error, "trailing_metadata", lambda: None)() or ()
    hint = dict(trailing).get(RETRY_AFTER)
    return int(hint) / 1000 if hint is not None and str(hint).isdigit() else None


class NotGrpc(ValueError):
    """The address answers, but in HTTP/1: a web server (an OpenRLHF reward server, say), not a gRPC one."""


class Client:
    def __init__(
        self,
        address: str,
        service: ServiceDescriptor,
        *,
        token: str | None = None,
        timeout: float = 60.0,
        retries: int = 3,
        backoff: float = 0.2,
        busy_retries: int = 10,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
    ):
        """retries: tries again after UNAVAILABLE; busy_retries: after a busy server's refusal (any
        method: that refusal comes before the method runs); both within the call's deadline."""
        self.address, self.service = address, service
        self.timeout, self.retries, self.backoff, self.busy_retries = timeout, retries, backoff, busy_retries
        token = env_token() if token is None else token  # "" sends none
        self.metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.channel = tls.channel(address, service.name, channel_options(max_message_bytes))
        self._calls = {m.name: client_call(self.channel, m) for m in service.methods}

    def call(
        self, method: str, request: Payload | Message | None = None, *, timeout: float | None = None
    ) -> Payload | Message:
        """Call `method`; retries UNAVAILABLE and busy refusals with backoff within one overall deadline."""
        m = self._method(method)
        if request is None:
            request = message_class(m.input_type)()
        deadline = time.monotonic() + (timeout or self.timeout)
        rows = len(request.data) if isinstance(request, Payload) and request.data is not None else None
        with telemetry.span(
            f"{self.service.name}/{method}", telemetry.trace.SpanKind.CLIENT, rows=rows, address=self.address
        ):
            metadata = telemetry.inject(self.metadata)  # the server's span continues this trace
            return self._call_with_retries(method, request, deadline, metadata)

    def call_message(
        self, method: str, request: Payload | Message | None, reply: type[M], *, timeout: float | None = None
    ) -> M:
        """call() for a method whose reply is a plain message of class `reply`: that message."""
        self._check_reply(method, reply, batch=False)
        out = self.call(method, request, timeout=timeout)
        assert isinstance(out, reply)  # _check_reply: the method's reply class, which carries no batch
        return out

    def call_batch(
        self, method: str, request: Payload | Message | None, reply: type[M], *, timeout: float | None = None
    ) -> tuple[M, DataProto]:
        """call() for a method whose reply of class `reply` carries a batch: (the message, the batch).
        ValueError if the server sent no batch (a server of another make may)."""
        self._check_reply(method, reply, batch=True)
        out = self.call(method, request, timeout=timeout)
        assert isinstance(out, Payload) and isinstance(out.msg, reply)  # as _check_reply made sure
        if out.data is None:
            raise ValueError(f"{self.service.name}.{method} at {self.address} returned no batch (`data` unset)")
        return out.msg, out.data

    def describe(self, *, timeout: float | None = None) -> common_pb2.ServiceInfo:
        """The service's Describe: every meshrl service has it, with a ServiceInfo reply."""
        return self.call_message("Describe", None, common_pb2.ServiceInfo, timeout=timeout)

    def _method(self, name: str) -> MethodDescriptor:
        m = self.service.methods_by_name.get(name)
        if m is None:
            raise ValueError(f"{self.service.full_name} has no method {name!r}; it has {sorted(self._calls)}")
        return m

    def _check_reply(self, method: str, reply: type[Message], batch: bool) -> None:
        """TypeError unless `reply` is `method`'s reply class and carries a batch exactly when `batch`."""
        out = self._method(method).output_type
        if reply.DESCRIPTOR is not out:
            raise TypeError(f"{self.service.name}.{method} replies with {out.name}, not {reply.__name__}")
        if (data_field_number(reply) is not None) != batch:
            use, has = ("call_message", "no batch") if batch else ("call_batch", "a batch")
            raise TypeError(f"{out.name} carries {has}: call {self.service.name}.{method} with {use}")

    def _call_with_retries(self, method: str, request, deadline: float, metadata):
        unavailable = busy = 0  # retries so far of each kind
        while True:
            try:
                return self._calls[method](request, max(0.001, deadline - time.monotonic()), metadata)
            except grpc.RpcError as e:
                hint = retry_after(e)
                if hint is not None and busy < self.busy_retries:
                    # full jitter on top of the hint: callers refused together come back spread out
                    pause = hint + random.uniform(0, min(MAX_JITTER, self.backoff * 2**busy))
                    busy += 1
                elif e.code() in RETRYABLE and unavailable < self.retries:
                    pause = self.backoff * 2**unavailable
                    unavailable += 1
                else:
                    pause = None
                if pause is None or time.monotonic() + pause >= deadline:
                    raise ServiceError(self.address, f"{self.service.name}.{method}", e.code(), e.details()) from None
                time.sleep(pause)

    def call_stream(self, method: str, messages: Iterable[Message | bytes], *, timeout: float | None = None) -> Message:
        """Send a stream of plain messages (no batch), or of their bytes already encoded (see
        meshrl.codec.rawbytes); no retries, since a stream cannot be replayed."""
        m = self.service.methods_by_name.get(method)
        if m is None or not m.client_streaming or data_field_number(message_class(m.input_type)) is not None:
            raise ValueError(f"{self.service.full_name}.{method} is not a stream of plain messages")
        stub = self.channel.stream_unary(
            method_path(m), request_serializer=_serialize, response_deserializer=message_class(m.output_type).FromString
        )
        try:
            with telemetry.span(f"{self.service.name}/{method}", telemetry.trace.SpanKind.CLIENT, address=self.address):
                return stub(iter(messages), timeout=timeout or self.timeout, metadata=telemetry.inject(self.metadata))
        except grpc.RpcError as e:
            raise ServiceError(self.address, f"{self.service.name}.{method}", e.code(), e.details()) from None

    def health(self, service: str = "", timeout: float = 5.0) -> str:
        """SERVING, NOT_SERVING, UNKNOWN or SERVICE_UNKNOWN; raises ServiceError if unreachable."""
        stub = health_pb2_grpc.HealthStub(self.channel)
        try:
            reply = stub.Check(  # type: ignore[attr-defined]  # types-grpcio-health-checking leaves the stub's methods out
                health_pb2.HealthCheckRequest(service=service), timeout=timeout, metadata=self.metadata
            )
        except grpc.RpcError as e:
            raise ServiceError(self.address, "Health.Check", e.code(), e.details()) from None
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Block until the service reports SERVING; TimeoutError naming the address otherwise.

        The health check asks for the service by its full name (e.g. meshrl.v1.RewardService). A
        server whose health does not know that name (NOT_FOUND) is asked over reflection which
        services it has: another service there is a ValueError naming it; a server that lists this
        service, or has no reflection, counts as ready (an external server that answers only the
        whole server's health). A server that answers in HTTP/1 is a NotGrpc (a ValueError) at once.
        """
        deadline = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < deadline:
            try:
                status = self.health(self.service.full_name, timeout=min(5.0, max(0.1, deadline - time.monotonic())))
                if status == "SERVING":
                    return
                last = status
            except ServiceError as e:
                if e.code == grpc.StatusCode.NOT_FOUND:
                    return self._check_identity()
                if any(answer in (e.details or "") for answer in HTTP1_ANSWERS):
                    raise NotGrpc(f"{self.address} answers HTTP/1, not gRPC") from None
                last = f"{e.code.name}: {e.details}"
            time.sleep(0.1)
        raise TimeoutError(f"{self.service.name} at {self.address} not ready after {timeout:.0f}s ({last})")

    def _check_identity(self) -> None:
        there = self.list_services()
        if there is not None and self.service.full_name not in there:
            ours = sorted(s for s in there if not s.startswith("grpc."))
            raise ValueError(
                f"{self.address} serves {ours or 'no application service'}, not "
                f"{self.service.full_name}: is the address right?"
            )

    def list_services(self, timeout: float = 5.0) -> list[str] | None:
        """The services the server lists over reflection; None if it has no reflection."""
        from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

        stub = reflection_pb2_grpc.ServerReflectionStub(self.channel)
        try:
            # types-grpcio-reflection types this method as binascii.Incomplete (an exception class)
            replies = stub.ServerReflectionInfo(  # type: ignore[operator]
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                timeout=timeout,
                metadata=self.metadata,
            )
            return [s.name for r in replies for s in r.list_services_response.service]
        except grpc.RpcError:
            return None

    def close(self) -> None:
        self.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _serialize(msg: Message | bytes) -> bytes:
    return msg if isinstance(msg, bytes) else msg.SerializeToString()
