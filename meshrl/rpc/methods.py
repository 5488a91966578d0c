"""Server handlers and client callables for a proto service, with the batch codec in one place.

Handlers are registered with raw bytes in and out, so that decoding happens inside
the handler, where the error interceptor turns a bad request into
INVALID_ARGUMENT (a failing gRPC deserializer would give INTERNAL). A servicer
method sees a Payload for messages that carry a batch (see meshrl.codec.payload)
and the plain message otherwise, and returns the same kind; a streamed request
arrives assembled, a large response leaves as a row stream.
"""

from collections.abc import Callable, Iterable, Iterator
from typing import Any, cast

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from google.protobuf.message import Message

from meshrl.codec.payload import Assembler, Payload, data_field_number, decode_message, split_rows


def message_class(descriptor) -> type[Message]:
    return message_factory.GetMessageClass(descriptor)


def method_path(method: MethodDescriptor) -> str:
    return f"/{method.containing_service.full_name}/{method.name}"


def raw_request(fn: Callable) -> Callable:
    """Mark a servicer method that decodes its own request stream (it gets the raw bytes of each
    message), e.g. to read a large bytes field without protobuf's copies (meshrl.codec.rawbytes)."""
    fn.__dict__["raw_request"] = True  # a function attribute, which mypy cannot declare; read with getattr
    return fn


def read_request(cls: type[Message], request: bytes | Iterable[bytes], streaming: bool):
    """A Payload (batch-carrying types), a message, or, for a stream of messages without a batch,
    an iterator of messages (e.g. weight buckets, which the servicer consumes as they come)."""
    if not streaming:
        payload = decode_message(cls, cast(bytes, request))[0]
        return payload if data_field_number(cls) is not None else payload.msg
    parts = cast(Iterable[bytes], request)  # a stream: each message's bytes, as they come
    if data_field_number(cls) is None:
        return (cls.FromString(part) for part in parts)
    asm = Assembler(cls)
    for part in parts:
        asm.add(part)
    return asm.result()


def write_reply(cls: type[Message], reply: Any, streaming: bool) -> bytes | Iterator[bytes]:
    if isinstance(reply, Payload):
        payload = reply
    elif isinstance(reply, Message):
        payload = Payload(reply)
    else:
        raise TypeError(f"a handler returned {type(reply).__name__}, expected {cls.__name__} or Payload")
    if not isinstance(payload.msg, cls):
        raise TypeError(f"a handler returned {type(payload.msg).__name__}, expected {cls.__name__}")
    parts = split_rows(payload)
    return parts if streaming else b"".join(parts)


def service_handler(servicer: Any, service: ServiceDescriptor) -> grpc.GenericRpcHandler:
    """A handler for every method of `service` that `servicer` implements (others: UNIMPLEMENTED)."""
    handlers = {}
    for method in service.methods:
        fn = getattr(servicer, method.name, None)
        if fn is not None:
            handlers[method.name] = _method_handler(fn, method)
    return grpc.method_handlers_generic_handler(service.full_name, handlers)


def _method_handler(fn: Callable, method: MethodDescriptor) -> grpc.RpcMethodHandler:
    req_cls, resp_cls = message_class(method.input_type), message_class(method.output_type)
    cs, ss = method.client_streaming, method.server_streaming

    raw = getattr(fn, "raw_request", False)

    def behavior(request, context):
        return write_reply(resp_cls, fn(request if raw else read_request(req_cls, request, cs), context), ss)

    if ss:

        def streaming_behavior(request, context):
            yield from behavior(request, context)

        make = grpc.stream_stream_rpc_method_handler if cs else grpc.unary_stream_rpc_method_handler
        return make(streaming_behavior)
    make = grpc.stream_unary_rpc_method_handler if cs else grpc.unary_unary_rpc_method_handler
    return make(behavior)


def client_call(channel: grpc.Channel, method: MethodDescriptor) -> Callable[..., Payload | Message]:
    """A function (request: Payload | Message, timeout, metadata) -> reply for one method."""
    req_cls, resp_cls = message_class(method.input_type), message_class(method.output_type)
    cs, ss = method.client_streaming, method.server_streaming
    kinds: dict[tuple[bool, bool], Callable[[str], Callable[..., Any]]] = {
        (False, False): channel.unary_unary,
        (True, False): channel.stream_unary,
        (False, True): channel.unary_stream,
        (True, True): channel.stream_stream,
    }
    stub = kinds[(cs, ss)](method_path(method))  # no (de)serializers: bytes both ways

    def call(request: Payload | Message, timeout: float, metadata) -> Payload | Message:
        payload = request if isinstance(request, Payload) else Payload(request)
        if not isinstance(payload.msg, req_cls):
            raise TypeError(f"{method.name} takes {req_cls.__name__}, got {type(payload.msg).__name__}")
        parts = split_rows(payload)
        reply = stub(parts if cs else b"".join(parts), timeout=timeout, metadata=metadata)
        return read_request(resp_cls, reply, ss)

    return call
