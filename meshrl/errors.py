"""The errors services raise on purpose, and the gRPC status each becomes.

A service method raises one of these (or ValueError for bad input); the error
interceptor in meshrl.rpc turns it into a status with the message as details.
Anything else is a bug and becomes INTERNAL, with the traceback in the service log.
"""

import grpc
from google.protobuf.message import DecodeError


class InvalidArgument(ValueError):
    """The request is malformed: a missing field, a wrong shape, an unknown name."""


MAX_COUNTER = 2**53 - 1  # step ids and weight versions: exact as float64 metrics, far from int64's end
MAX_STEP_ADVANCE = 10_000  # how far past the last applied step one Update may jump


def check_counter(value: int, field: str) -> int:
    """A step id or weight version in 1..MAX_COUNTER, else InvalidArgument naming the field (a version
    near 2**63 once pinned a rollout and broke every later reply)."""
    if not 0 < value <= MAX_COUNTER:
        raise InvalidArgument(f"{field} must be in 1..{MAX_COUNTER}, got {value}")
    return value


class FailedPrecondition(RuntimeError):
    """The request is well formed but the service is not in a state to serve it."""


class Aborted(RuntimeError):
    """The request was fine but could not be completed, e.g. a user's reward function failed on a sample
    or the caller went away mid-work; `meta` says how far it got, for the service's own bookkeeping."""

    def __init__(self, message: str, meta: dict | None = None):
        super().__init__(message)
        self.meta = meta or {}


class DataLoss(RuntimeError):
    """What arrived does not check out against what was sent (a weight push's checksum)."""


class ResourceExhausted(RuntimeError):
    """A limit of the service is reached (e.g. episodes open at once); the caller may retry later."""


class ServiceError(RuntimeError):
    """A call to a meshrl service failed; raised by meshrl.rpc.Client."""

    def __init__(self, address: str, method: str, code: grpc.StatusCode, details: str | None):
        """details: the status's text, as gRPC gives it (None when the status carried none)."""
        super().__init__(f"{method} at {address} failed: {code.name}: {details}")
        self.address, self.method, self.code, self.details = address, method, code, details


# Checked in order: the first matching class wins.
STATUS_FOR: list[tuple[type[BaseException], grpc.StatusCode]] = [
    (InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (DecodeError, grpc.StatusCode.INVALID_ARGUMENT),  # bytes that are not the request's message
    (ValueError, grpc.StatusCode.INVALID_ARGUMENT),
    (FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
    (Aborted, grpc.StatusCode.ABORTED),
    (DataLoss, grpc.StatusCode.DATA_LOSS),
    (ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (FileNotFoundError, grpc.StatusCode.NOT_FOUND),
    (TimeoutError, grpc.StatusCode.DEADLINE_EXCEEDED),
    (NotImplementedError, grpc.StatusCode.UNIMPLEMENTED),
]


# UTF-8 bytes of an error's text sent back. gRPC percent-encodes every byte outside printable ASCII
# (3 on the wire), and a caller refuses trailers past 8 KiB (at random up to 16 KiB) with RESOURCE_EXHAUSTED:
# 2,000 bytes stay under 6,000 on the wire in any script (2,000 characters of '€' were ~18 KB).
MAX_DETAILS = 2000


def details_for(error: BaseException, internal: bool = False) -> str:
    """The status text: the message (with the type for a bug), cut to MAX_DETAILS bytes so that an error
    quoting a huge field never turns into RESOURCE_EXHAUSTED on the caller's side."""
    text = f"{type(error).__name__}: {error}" if internal else str(error)
    raw = text.encode("utf-8", "replace")  # a lone surrogate becomes '?': the trailers must encode
    if len(raw) <= MAX_DETAILS:
        return raw.decode("utf-8")
    suffix = f"... [{len(text)} chars]"
    # "ignore" drops only the last character when the cut falls inside it: raw is valid UTF-8 up to there
    return raw[: MAX_DETAILS - len(suffix)].decode("utf-8", "ignore") + suffix


def status_for(error: BaseException) -> grpc.StatusCode:
    if isinstance(error, ServiceError):  # a service we called refused: pass its status on
        return error.code
    for cls, code in STATUS_FOR:
        if isinstance(error, cls):
            return code
    return grpc.StatusCode.INTERNAL
