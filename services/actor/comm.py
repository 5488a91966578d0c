"""Rank 0 drives the group; the other ranks follow. Commands and batches travel as bytes.

Every call is: broadcast the command (a meshrl.v1.Value, never pickle), send each
rank its part of the batch, every rank runs the same handler method, gather the
results to rank 0. Bytes ride in uint8 tensors over the process group's CPU
backend (gloo), so this works the same when the model's collectives use NCCL.

A call whose caller can go away (a cancelled or expired RPC, a service told to
stop) is watched on rank 0; the engine asks `stop_requested()` between
micro-batches (a weight push between buckets), every rank at the same point, so
all ranks stop together. A call waiting its turn behind another is dropped, not
run, when its caller leaves meanwhile.
"""

import threading
from collections.abc import Callable

import torch
import torch.distributed as dist

from meshrl.codec import decode_dataproto, encode_dataproto
from meshrl.codec.values import from_value, to_value
from meshrl.dataproto import DataProto
from meshrl.v1 import data_pb2 as pb

STOP = "stop"
_alive: Callable[[], bool] | None = None  # rank 0, during a call: False once its caller has gone


class Cancelled(RuntimeError):
    """Rank 0's caller went away; every rank stopped at the same micro-batch. `meta` goes back to rank 0."""

    def __init__(self, message: str, meta: dict | None = None):
        super().__init__(message)
        self.meta = meta or {}


def stop_requested() -> bool:
    """Whether rank 0's caller has gone. Collective: every rank calls it at the same points."""
    flag = int(_alive is not None and not _alive())
    if dist.get_world_size() > 1:
        t = torch.tensor([flag], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        flag = int(t)
    return bool(flag)


def caller_alive() -> bool:
    """Rank 0 only, not collective: whether the caller of the call running now is still there (for what
    rank 0 alone waits on, e.g. the rollout during a weight push)."""
    alive = _alive
    return alive is None or alive()


def _to_bytes(data: DataProto | None) -> bytes:
    return b"" if data is None else b"".join(encode_dataproto(data))


def _from_bytes(buf: bytes) -> DataProto | None:
    return decode_dataproto(buf)[0] if buf else None


class Group:
    def __init__(self):
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()

    def broadcast(self, data: bytes | None) -> bytes:
        """Rank 0's `data` on every rank (the other ranks pass None)."""
        if self.rank == 0:
            assert data is not None
            dist.broadcast(torch.tensor([len(data)], dtype=torch.int64), 0)
            if data:
                dist.broadcast(torch.frombuffer(bytearray(data), dtype=torch.uint8), 0)
            return data
        size = torch.tensor([0], dtype=torch.int64)
        dist.broadcast(size, 0)
        buf = torch.empty(int(size.item()), dtype=torch.uint8)
        if len(buf):
            dist.broadcast(buf, 0)
        return bytes(buf.numpy())

    def scatter(self, parts: list[bytes] | None) -> bytes:
        """Rank 0's parts[r] on rank r (the other ranks pass None)."""
        if self.rank == 0:
            assert parts is not None
            dist.broadcast(torch.tensor([len(p) for p in parts], dtype=torch.int64), 0)
            for r in range(1, self.world_size):
                if parts[r]:
                    dist.send(torch.frombuffer(bytearray(parts[r]), dtype=torch.uint8), dst=r)
            return parts[0]
        sizes = torch.tensor([0] * self.world_size, dtype=torch.int64)
        dist.broadcast(sizes, 0)
        buf = torch.empty(int(sizes[self.rank]), dtype=torch.uint8)
        if len(buf):
            dist.recv(buf, src=0)
        return bytes(buf.numpy())

    def gather(self, data: bytes) -> list[bytes] | None:
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world_size)]
        dist.all_gather(sizes, torch.tensor([len(data)], dtype=torch.int64))
        if self.rank != 0:
            if data:
                dist.send(torch.frombuffer(bytearray(data), dtype=torch.uint8), dst=0)
            return None
        out = [data]
        for r in range(1, self.world_size):
            buf = torch.empty(int(sizes[r]), dtype=torch.uint8)
            if len(buf):
                dist.recv(buf, src=r)
            out.append(bytes(buf.numpy()))
        return out


def run_command(handler, method: str, args: dict, part: DataProto | None) -> DataProto:
    """Run handler.<method>(args, part) on this rank; an error comes back as meta, not as a crash."""
    try:
        out = getattr(handler, method)(args, part)
        return out if out is not None else DataProto()
    except Exception as e:  # noqa: BLE001 - reported to rank 0, which raises it to the caller
        return DataProto(
            meta_info={**getattr(e, "meta", {}), "error": f"{type(e).__name__}: {e}", "error_type": type(e).__name__}
        )


class Driver:
    """Rank 0's side: one call at a time through the whole group."""

    def __init__(self, handler):
        self.group, self.handler = Group(), handler
        self.lock = threading.Lock()

    def call(
        self,
        method: str,
        args: dict | None = None,
        parts: list[DataProto] | None = None,
        alive: Callable[[], bool] | None = None,
    ) -> list[DataProto]:
        """Run `method` on every rank with its part; returns every rank's result (errors raised).
        `alive() == False` (the caller went away) stops the work at the next micro-batch."""
        global _alive
        args = args or {}
        self._take_turn(method, alive)
        try:
            self.group.broadcast(to_value({"method": method, "args": args}, "command").SerializeToString())
            encoded = [_to_bytes(p) for p in parts] if parts else [b""] * self.group.world_size
            mine = _from_bytes(self.group.scatter(encoded))
            _alive = alive
            try:
                result = run_command(self.handler, method, args, mine)
            finally:
                _alive = None
            gathered = self.group.gather(_to_bytes(result))
            assert gathered is not None  # rank 0 gathers every rank's
            replies = [_from_bytes(b) for b in gathered]
        finally:
            self.lock.release()
        results = [DataProto() if r is None else r for r in replies]  # not `or`: an empty batch is falsy
        errors = [(r, d.meta_info) for r, d in enumerate(results) if "error" in d.meta_info]
        if errors:
            rank, meta = errors[0]
            raise RankError(rank, meta["error_type"], meta["error"], meta)
        return results

    def _take_turn(self, method: str, alive: Callable[[], bool] | None) -> None:
        """Hold the lock; a caller who leaves while the call waits (a push queued behind a stalled one)
        gets it dropped, not run after they left."""
        while not self.lock.acquire(timeout=0.1):
            if alive is not None and not alive():
                raise RankError(
                    0, Cancelled.__name__, f"{method}: its caller went away while it waited for the call before it"
                )
        if alive is not None and not alive():
            self.lock.release()
            raise RankError(0, Cancelled.__name__, f"{method}: its caller went away before it started")

    def stop(self) -> None:
        with self.lock:
            self.group.broadcast(to_value({"method": STOP, "args": {}}, "command").SerializeToString())


class RankError(RuntimeError):
    def __init__(self, rank: int, error_type: str, message: str, meta: dict | None = None):
        super().__init__(f"rank {rank}: {message}")
        self.rank, self.error_type, self.meta = rank, error_type, meta or {}


def follow(handler) -> None:
    """The other ranks' loop: run what rank 0 sends until it says stop."""
    group = Group()
    while True:
        command = from_value(pb.Value.FromString(group.broadcast(None)), "command")
        if command["method"] == STOP:
            return
        part = _from_bytes(group.scatter(None))
        group.gather(_to_bytes(run_command(handler, command["method"], command["args"], part)))
