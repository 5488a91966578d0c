"""Weight handoff, the sender's side and the layout both sides share.

Parameters travel in buckets of bounded size (DEFAULT_BUCKET_BYTES unless the
caller says otherwise): each tensor at a 64-byte aligned offset in its bucket,
described by a TensorRef (HF name, dtype, shape, offset). One transformer block
never spans two buckets (the receiving engine fuses a block's projections and
processes a layer only once all its parts arrived). The sender pushes to a
rollout service with BeginWeightUpdate, one SendWeights call per bucket, and
FinishWeightUpdate with the new version:

- shm: write the bucket straight into the /dev/shm segment Begin names (one
  copy), send only the refs; only a segment of ours sealed for this update
  (Begin's shm_nonce; meshrl.shm.open_sealed) is written, any other refused;
- stream: send the bucket's bytes in chunks (for another host);
- cuda_ipc: share a reused CUDA bucket by IPC handle (same GPU); a sender on
  several GPUs shares a copy on each (`share`), and each receiving process
  reads the one on its own GPU.

A fleet of rollout replicas gets one push (push_to_all): each bucket gathered
once and sent to every replica side by side. With shm (every replica on the
sender's host) it is also written once: into one replica's segment, which the
others read (WeightBucket.shm_source); with cuda_ipc every replica gets the same
handles; with stream and `relay`, the bucket goes down a chain (the first replica
passes it on to the next as it arrives, and so on; services/rollout/relay.py), so
the sender sends it once, and again only to the replicas the chain did not reach.

A push may send only what changed since the last (Push.base, Push.delta;
meshrl/delta.py): each bucket then travels as a Payload whose parts are the
changed elements, and the rollout rebuilds the tensors from its own base.

Tensors are asked for one bucket at a time (`tensors_of`), so a sender that
gathers them (an FSDP actor) never holds more than one bucket's worth. Each call
to the rollout has a deadline scaled by the bytes it moves (`call_timeout`),
never past the sender's own.
"""

import concurrent.futures
import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
import torch

from meshrl.codec.dtypes import TO_TORCH, wire_dtype
from meshrl.codec.frame import tensor_bytes
from meshrl.codec.rawbytes import encode_bytes_field
from meshrl.config.rollout import DEFAULT_BUCKET_BYTES, TRANSPORTS
from meshrl.delta import ALIGN, Base, Payload, aligned, payload_nbytes, whole
from meshrl.errors import ServiceError
from meshrl.shm import open_sealed
from meshrl.v1 import rollout_pb2

log = logging.getLogger(__name__)
CHUNK_BYTES = 4 << 20
# A call to the rollout may take CALL_BASE_SECONDS beyond its bytes (Begin waits for the generations in
# flight with rollout.on_update=wait), and its bytes may move as slowly as FLOOR_BYTES_PER_SECOND: far
# below what was measured (stream 0.6 GB/s, shm 3.7 GB/s; shared NOTES).
CALL_BASE_SECONDS = 120.0
FLOOR_BYTES_PER_SECOND = 16 << 20


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@dataclass
class Bucket:
    refs: list  # rollout_pb2.TensorRef, offsets from the bucket's start
    size: int  # bytes, padding included


def block_of(name: str) -> str:
    """What must travel together: a numbered block (model.layers.3) whole, else the parameter's module."""
    parts = name.split(".")
    for i, p in enumerate(parts):
        if p.isdigit():
            return ".".join(parts[: i + 1])
    return ".".join(parts[:-1])


def plan(specs: list[tuple[str, torch.dtype, list[int]]], bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> list[Bucket]:
    """Buckets for (name, dtype, shape) specs, in order, each at most bucket_bytes unless one block alone is
    larger (then that block is a bucket of its own)."""
    if bucket_bytes < ALIGN:
        raise ValueError(f"bucket_bytes must be >= {ALIGN}, got {bucket_bytes}")
    blocks: dict[str, list] = {}
    for spec in specs:
        blocks.setdefault(block_of(spec[0]), []).append(spec)
    buckets: list[Bucket] = []
    refs: list[rollout_pb2.TensorRef] = []
    size = 0
    for block in blocks.values():
        need = sum(aligned(math.prod(shape) * dtype.itemsize) for _, dtype, shape in block)
        if refs and size + need > bucket_bytes:
            buckets.append(Bucket(refs, size))
            refs, size = [], 0
        for name, dtype, shape in block:
            refs.append(rollout_pb2.TensorRef(name=name, dtype=wire_dtype(dtype, name), shape=list(shape), offset=size))
            size += aligned(math.prod(shape) * dtype.itemsize)
    if refs:
        buckets.append(Bucket(refs, size))
    return buckets


def layout(named: dict[str, torch.Tensor]) -> tuple[list[rollout_pb2.TensorRef], int]:
    """Refs for each tensor in one bucket holding them all, and its size."""
    (whole,) = plan([(k, t.dtype, list(t.shape)) for k, t in named.items()], bucket_bytes=1 << 62) or [Bucket([], 0)]
    return whole.refs, whole.size


def ref_dtype(ref: rollout_pb2.TensorRef) -> torch.dtype:
    if ref.dtype not in TO_TORCH:
        raise ValueError(f"tensor {ref.name!r}: unknown dtype {ref.dtype}")
    return TO_TORCH[ref.dtype]


def ref_nbytes(ref: rollout_pb2.TensorRef) -> int:
    return math.prod(ref.shape) * ref_dtype(ref).itemsize


def wire_nbytes(ref: rollout_pb2.TensorRef) -> int:
    """Bytes the ref's tensor takes in its bucket on the wire (a delta push's changes only: meshrl.delta)."""
    return payload_nbytes(ref, ref_dtype(ref).itemsize)


def call_timeout(num_bytes: int, deadline: float | None = None) -> float:
    """Seconds a call moving num_bytes may take; never past `deadline` (time.monotonic()), if given."""
    seconds = CALL_BASE_SECONDS + num_bytes / FLOOR_BYTES_PER_SECOND
    return seconds if deadline is None else max(0.001, min(seconds, deadline - time.monotonic()))


def stream_chunks(payload: Payload, chunk: int = CHUNK_BYTES) -> Iterator[tuple[int, list[memoryview]]]:
    """(offset, pieces) of one bucket, about `chunk` bytes each (views of the tensors, not copies);
    padding between tensors is not sent."""
    pieces: list[memoryview] = []
    size = start = 0
    for part in payload.parts:
        raw = tensor_bytes(part.tensor, part.name)
        pos = 0
        while pos < len(raw):
            if not pieces:
                start = part.offset + pos
            take = min(len(raw) - pos, chunk - size)
            pieces.append(raw[pos : pos + take])
            size += take
            pos += take
            if size >= chunk or pos < len(raw):
                yield start, pieces
                pieces, size = [], 0
        if pieces:  # the next tensor starts after alignment padding: close this piece
            yield start, pieces
            pieces, size = [], 0


@dataclass
class Push:
    """One push's settings. version: what the rollouts take; rollback: even below their own (a run going
    back to a checkpoint). deadline (time.monotonic()): when the sender's own caller stops waiting.
    lora: the buckets hold this LoRA adapter (peft's tensor names, as peft.get_peft_model_state_dict gives
    them), not the model's weights. share (cuda_ipc): share(bucket, tensors) gives the CudaIpcHandles of
    the bucket's copies, one per GPU, the first this process's (by default: one copy, in this process's
    reused CUDA bucket). relay (stream): down a chain of the replicas. base (meshrl.delta): the push keeps
    (or updates) the sender's base and tells the rollouts to keep theirs; delta: it sends the changes since
    the base's version, where there is one (else the full weights)."""

    version: int
    transport: str
    deadline: float | None = None
    rollback: bool = False
    lora: rollout_pb2.LoraAdapter | None = None
    share: Callable[[Bucket, list[torch.Tensor]], list] | None = None
    relay: bool = False
    base: Base | None = None
    delta: bool = False

    def __post_init__(self) -> None:
        if self.transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, got {self.transport!r}")
        if self.base is not None and (self.transport == "cuda_ipc" or self.lora is not None):
            raise ValueError("a delta push (a kept base) is for full weights over shm or stream")

    @property
    def delta_base(self) -> int:
        """The version this push sends the changes from; 0: it sends the full weights. A push of the base's
        own version (a replica catching up) or a rollback is full."""
        base = self.base
        if base is None or not self.delta or self.rollback or not 0 < base.version < self.version:
            return 0
        return base.version


def push_to_all(
    clients: list, buckets: list[Bucket], tensors_of: Callable[[Bucket], list[torch.Tensor]], push: Push
) -> tuple[dict[str, float], dict[str, Exception]]:
    """Send the buckets to the rollout services behind `clients` (meshrl.rpc.Clients: one rollout, or the
    replicas of a fleet), each bucket gathered once and sent to every replica side by side, the way its
    transport does (SENDERS). tensors_of(bucket) gives a bucket's tensors in its refs' order, on any
    device, when it is its turn.

    A replica that fails is dropped from the rest of the push and its error returned by address; the push
    raises the first error only when every replica failed (with one rollout: its error). Returns
    (stats, {address: error})."""
    start = time.perf_counter()
    total, largest = sum(b.size for b in buckets), max((b.size for b in buckets), default=0)
    fleet = Fleet(clients)
    delta_base = push.delta_base
    begin = rollout_pb2.BeginWeightUpdateRequest(
        version=push.version,
        transport=push.transport,
        total_bytes=total,
        bucket_bytes=largest,
        rollback=push.rollback,
        lora=push.lora,
        keep_base=push.base is not None,
        delta_base=delta_base,
    )  # the rollout may make (fault in) a segment this large
    if push.base is not None:
        push.base.version = 0  # until this push ends (a Begin every replica refuses too): no version's
    begun = fleet.each(lambda c: c.call("BeginWeightUpdate", begin, timeout=call_timeout(largest, push.deadline)))
    sender = SENDERS[push.transport](push, fleet, begun, largest)
    gather, sent_bytes = 0.0, 0
    # a push that keeps a base sends a bucket while the next is gathered and encoded (its comparison and
    # checksums cost about what the bytes they save would): two buckets in memory, not one
    with Sending(sender, ahead=push.base is not None) as sending:
        for b in buckets:
            t0 = time.perf_counter()
            tensors = tensors_of(b)
            gather += time.perf_counter() - t0
            if push.base is None:
                payload = whole(b.refs, b.size, tensors)
            else:
                payload = push.base.encode(b.refs, tensors, bool(delta_base))
            sent_bytes += payload.num_bytes
            sending.send(payload)
    sent = time.perf_counter()
    finish = rollout_pb2.FinishWeightUpdateRequest(version=push.version)
    fleet.each(lambda c: c.call("FinishWeightUpdate", finish, timeout=call_timeout(total, push.deadline)))
    if push.base is not None:
        push.base.version = push.version
    done = time.perf_counter()  # one bucket is loaded whole at the finish
    stats = {
        "num_bytes": float(sum(ref_nbytes(r) for b in buckets for r in b.refs)),
        "sent_bytes": float(sent_bytes),
        "delta": float(bool(delta_base)),
        "seconds": done - start,
        "buckets": float(len(buckets)),
        "gather_seconds": gather,
        "transfer_seconds": sent - start,
        "load_seconds": done - sent,
    }
    return stats, fleet.failed


class Sending:
    """Buckets to a Sender in order: at once, or (ahead) each in a thread of its own while the caller
    prepares the next, which waits for it before it goes (one staging space per replica)."""

    def __init__(self, sender: "Sender", ahead: bool):
        self.sender = sender
        self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="meshrl-send") if ahead else None
        self.pending: concurrent.futures.Future | None = None

    def send(self, payload: Payload) -> None:
        if self.pool is None:
            self.sender.send(payload)
            return
        if self.pending is not None:
            self.pending.result()
        self.pending = self.pool.submit(self.sender.send, payload)

    def __enter__(self) -> "Sending":
        return self

    def __exit__(self, *error) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)
            if self.pending is not None and error[0] is None:
                self.pending.result()


class Sender:
    """How one transport sends a bucket to the fleet's live replicas (send_to: one SendWeights call each)."""

    def __init__(self, push: Push, fleet: "Fleet", begun: dict, largest: int):
        self.push, self.fleet, self.begun = push, fleet, begun

    def send(self, b: Payload) -> None:
        raise NotImplementedError

    def send_to(self, b: Payload, messages_for: Callable) -> None:
        timeout = call_timeout(b.size, self.push.deadline)
        self.fleet.each(lambda c: c.call_stream("SendWeights", messages_for(c), timeout=timeout))


class ShmSender(Sender):
    """shm: the bucket written once, into the first live replica's segment; the others read it from there
    (WeightBucket.shm_source)."""

    def send(self, b: Payload) -> None:
        source = _write_once(self.fleet, self.begun, b)

        def messages(c):
            there = self.begun[source] if c.address != source else None
            shared = {"shm_source": there.shm_segment, "shm_source_nonce": there.shm_nonce} if there else {}
            return iter([rollout_pb2.WeightBucket(version=self.push.version, refs=b.refs, **shared)])

        self.send_to(b, messages)


class StreamSender(Sender):
    """stream: the bucket's bytes in chunks to each replica, or (relay) down a chain of them."""

    def send(self, b: Payload) -> None:
        for part in b.parts:
            part.tensor = part.tensor.detach().cpu()
        if self.push.relay and len(self.fleet.live) > 1:
            _chain(self.fleet, self.push.version, b, call_timeout(b.size, self.push.deadline))
        else:
            self.send_to(b, lambda c: _stream(self.push.version, b))


class CudaIpcSender(Sender):
    """cuda_ipc: the same IPC handles of the bucket's copies (one per GPU) to every replica."""

    def __init__(self, push: Push, fleet: "Fleet", begun: dict, largest: int):
        super().__init__(push, fleet, begun, largest)
        if push.share is None:
            from meshrl.cuda_ipc import CudaBucket

            staging = CudaBucket(largest)
            self.share: Callable = lambda b, tensors: [staging.fill(tensors, b)]
        else:
            self.share = push.share

    def send(self, b: Payload) -> None:
        first, *copies = self.share(Bucket(b.refs, b.size), [p.tensor for p in b.parts])
        msg = rollout_pb2.WeightBucket(version=self.push.version, refs=b.refs, cuda_ipc=first, cuda_ipc_copies=copies)
        self.send_to(b, lambda c: iter([msg]))


SENDERS: dict[str, type[Sender]] = {"shm": ShmSender, "stream": StreamSender, "cuda_ipc": CudaIpcSender}
assert SENDERS.keys() == set(TRANSPORTS)


class Fleet:
    """The replicas a push goes to: each call made on every one still in it, side by side (one replica: in
    this thread). A replica whose call raises leaves the fleet, its error kept; when none is left the
    first error is raised."""

    def __init__(self, clients: list):
        self.live = list(clients)
        self.failed: dict[str, Exception] = {}

    def each(self, call: Callable) -> dict:
        """{address: call(client)} over the live replicas."""
        if len(self.live) == 1:
            outcomes = [self._outcome(call, self.live[0])]
        else:
            with concurrent.futures.ThreadPoolExecutor(len(self.live), thread_name_prefix="meshrl-push") as pool:
                outcomes = list(pool.map(lambda c: self._outcome(call, c), self.live))
        results = {}
        for c, (ok, value) in zip(list(self.live), outcomes):
            if ok:
                results[c.address] = value
            else:
                assert isinstance(value, Exception)
                self.drop(c, value)
        return results

    def drop(self, client, error: Exception) -> None:
        """The replica leaves the push; when none is left, the first error is raised."""
        self.live.remove(client)
        self.failed[client.address] = error
        if not self.live:
            raise next(iter(self.failed.values()))

    @staticmethod
    def _outcome(call: Callable, client) -> tuple[bool, object]:
        try:
            return True, call(client)
        except Exception as e:  # a service error, or a segment refused (_sealed_segment): this replica's
            return False, e


def _write_once(fleet: "Fleet", begun: dict, b: Payload) -> str:
    """shm: write the bucket into the segment of the first replica that still takes the push; the others
    are sent its name. A replica whose segment is refused leaves the push. Returns that replica's address."""
    for c in list(fleet.live):
        try:
            seg = _sealed_segment(c, begun[c.address])
        except ValueError as e:
            fleet.drop(c, e)  # raises once no replica is left
            continue
        for part in b.parts:
            t = part.tensor
            seg.tensor(t.dtype, list(t.shape), part.offset).copy_(t.detach())
        return c.address
    raise AssertionError("Fleet.drop raises when the last replica leaves")


def _chain(fleet: "Fleet", version: int, b: Payload, timeout: float) -> None:
    """stream: the bucket to the first live replica, naming the others as the chain it passes it down
    (WeightBucket.relay_to); those the chain did not reach (relay_missed) get it from here, as a chain of
    their own. A replica whose own call fails leaves the push; the rest of its chain is sent to."""
    pending = list(fleet.live)
    while pending:
        head, rest = pending[0], pending[1:]
        try:
            messages = _stream(version, b, [c.address for c in rest])
            reply = head.call_stream("SendWeights", messages, timeout=timeout)
        except Exception as e:  # this replica's own: it did not take the bucket
            fleet.drop(head, e)
            pending = rest
            continue
        if reply.error_code:  # its own failure, after it passed the bucket on: the chain below it went on
            code = grpc.StatusCode[reply.error_code]
            fleet.drop(head, ServiceError(head.address, "RolloutService.SendWeights", code, reply.error_details))
        missed = set(reply.relay_missed)
        if missed:
            log.warning(
                "a weight relay missed %d replica(s), sending to them directly: %s", len(missed), reply.relay_error
            )
        pending = [c for c in rest if c.address in missed]


def _sealed_segment(client, begun):
    """The segment Begin named, if it is ours and sealed for this update: a rollout's word is not enough
    to write into a file (meshrl.shm's docstring)."""
    try:
        return open_sealed(begun.shm_segment, begun.shm_nonce)
    except ValueError as e:
        raise ValueError(
            f"the rollout at {client.address} named a segment the push refused to write into: {e}"
        ) from None


def _stream(version: int, b: Payload, relay_to: list[str] | None = None):
    yield rollout_pb2.WeightBucket(version=version, refs=b.refs, relay_to=relay_to)
    for offset, pieces in stream_chunks(b):
        yield encode_bytes_field(rollout_pb2.WeightBucket(version=version, data_offset=offset), "data", pieces)


def push_state(
    client,
    named: dict[str, torch.Tensor],
    version: int,
    transport: str,
    *,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    rollback: bool = False,
    lora: rollout_pb2.LoraAdapter | None = None,
    base: Base | None = None,
) -> dict[str, float]:
    """A push (push_to_all) of a state dict held whole (HF names; an adapter's: peft's, with `lora`) to one
    rollout; its stats. base: a delta push from it where it has a version (meshrl.delta)."""
    buckets = plan([(k, t.dtype, list(t.shape)) for k, t in named.items()], bucket_bytes)
    tensors_of = lambda b: [named[r.name] for r in b.refs]  # noqa: E731
    push = Push(version, transport, rollback=rollback, lora=lora, base=base, delta=base is not None)
    return push_to_all([client], buckets, tensors_of, push)[0]
