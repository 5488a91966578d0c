"""A request or response message together with its batch, as one message or as a row stream.

Every meshrl message that carries a batch has a field `DataProto data`. In Python
such a message travels as Payload(msg, data): `msg` with `data` left unset, and
the batch as a DataProto, which the fast frame codec writes into the `data` field.

Large batches are streamed as consecutive row ranges, each part a complete
message of the same type (so any gRPC client can read or write them): the first
part carries the message's other fields and the batch's meta, every part says
which rows it holds. The Assembler checks order and completeness and copies the
parts into one batch, in buffers that grow with the rows received: the row count
a stream declares is the caller's word, not memory to set aside.
"""

import dataclasses
import math
from collections.abc import Iterator

import numpy as np
import torch
from google.protobuf.message import Message

from meshrl.codec import protowire as w
from meshrl.codec.frame import decode_dataproto, encode_dataproto, packed_tensors
from meshrl.codec.values import to_value
from meshrl.dataproto import DataProto, merge_meta

DATA_FIELD = "data"
CHUNK_BYTES = 4 << 20  # 1-4 MB chunks measured fastest on loopback here
# A streamed batch whose declared rows would take more is refused at its first part (INVALID_ARGUMENT):
# real batches here are a few GiB; memory follows the rows received in any case (Assembler).
MAX_BATCH_BYTES = 64 << 30
PACK_SAMPLE = 256  # rows packed to learn a packed batch's bytes per row


@dataclasses.dataclass
class Payload:
    msg: Message
    data: DataProto | None = None
    # Write the batch's token layout and response-aligned tensors unpadded (codec/packing.py); False for a
    # peer that may read only plain `tensors` (a reward server in any language).
    packed: bool = True


def data_field_number(cls: type[Message]) -> int | None:
    """The number of cls's `DataProto data` field, or None if it has none."""
    f = cls.DESCRIPTOR.fields_by_name.get(DATA_FIELD)
    if f is None or f.message_type is None or f.message_type.full_name != "meshrl.v1.DataProto":
        return None
    return f.number


def encode_message(
    msg: Message, data: DataProto | None = None, *, row_offset: int = 0, total_rows: int = 0, packed: bool = True
) -> bytes:
    """msg's bytes with `data` written into its DataProto field (packed: frame.encode_dataproto)."""
    prefix = msg.SerializeToString()
    if data is None:
        return prefix
    number = data_field_number(type(msg))
    if number is None:
        raise ValueError(f"{msg.DESCRIPTOR.full_name} has no `DataProto data` field")
    if msg.HasField(DATA_FIELD):
        raise ValueError(f"{msg.DESCRIPTOR.full_name}: pass the batch as data=, not in msg.data")
    tag = w.tag(number, w.LEN)
    size = 1  # bytes of the length varint; the tensors' alignment depends on it
    tensors = packed_tensors(data, packed)  # once: only the alignment changes between the rounds
    for _ in range(3):
        parts = encode_dataproto(
            data,
            base_offset=len(prefix) + len(tag) + size,
            row_offset=row_offset,
            total_rows=total_rows,
            packed=tensors,
        )
        n = sum(len(p) for p in parts)
        if w.varint_size(n) == size:
            break
        size = w.varint_size(n)
    return b"".join([prefix, tag, w.varint(n), *parts])


def decode_message(cls: type[Message], buf: bytes | memoryview) -> tuple[Payload, int, int]:
    """(Payload, row_offset, total_rows) from one message's bytes; ValueError on bad input."""
    number = data_field_number(cls)
    mv = memoryview(buf)
    if number is None:
        return Payload(cls.FromString(bytes(mv))), 0, 0
    small, span = [], None
    for f in w.scan(mv):
        if f.number == number and f.wire_type == w.LEN:
            if span is not None:
                raise ValueError(f"{cls.DESCRIPTOR.full_name}: field `data` appears twice")
            span = (f.value_start, f.end)
        else:
            small.append(mv[f.start : f.end])
    msg = cls.FromString(b"".join(small))
    if span is None:
        return Payload(msg), 0, 0
    data, row_offset, total_rows = decode_dataproto(mv, *span)
    return Payload(msg, data), row_offset, total_rows


def split_rows(payload: Payload, chunk_bytes: int | None = None) -> Iterator[bytes]:
    """The payload as one message, or as row-range messages of about chunk_bytes (default CHUNK_BYTES) each."""
    chunk_bytes = chunk_bytes or CHUNK_BYTES
    msg, data, packed = payload.msg, payload.data, payload.packed
    if data is None or len(data) <= 1:
        yield encode_message(msg, data, packed=packed)
        return
    rows = max(1, chunk_bytes // max(1, _row_bytes(data, packed)))
    if rows >= len(data):
        yield encode_message(msg, data, packed=packed)
        return
    empty = type(msg)()
    for start in range(0, len(data), rows):
        part = data.slice(start, start + rows)
        if start:
            part = DataProto(part.batch, part.non_tensor_batch)  # meta travels once, in the first part
        yield encode_message(msg if start == 0 else empty, part, row_offset=start, total_rows=len(data), packed=packed)


class Assembler:
    """Collects the messages of a stream into one Payload; ValueError on lost, extra or reordered parts,
    and on a declared size (total_rows) past max_bytes."""

    def __init__(self, cls: type[Message], max_bytes: int = MAX_BATCH_BYTES):
        self.cls, self.max_bytes = cls, max_bytes
        self.first: Payload | None = None
        self.total = 0  # rows announced; 0: a single unstreamed message
        self.received = 0
        self.out: DataProto | None = None  # from the second part on: `capacity` rows, the first `received` filled
        self.capacity = 0

    def add(self, buf: bytes | memoryview) -> None:
        payload, offset, total = decode_message(self.cls, buf)
        if self.first is None:
            if total and offset:
                raise ValueError(f"stream starts at row {offset}, expected 0 (chunks lost or reordered)")
            if total and payload.data is not None:
                self._check_declared(payload.data, total)
            self.first, self.total = payload, total
            self.received = len(payload.data) if payload.data is not None else 0
            return
        name = self.cls.DESCRIPTOR.full_name
        if not self.total or self.received >= self.total:
            raise ValueError(f"{name}: message after the end of the stream")
        if payload.data is None:
            raise ValueError(f"{name}: a stream part without `data`")
        if offset != self.received or total != self.total:
            raise ValueError(
                f"{name}: part holds rows from {offset} of {total}, expected rows from "
                f"{self.received} of {self.total} (chunks lost or reordered)"
            )
        if payload.msg.ByteSize() and payload.msg != self.first.msg:
            raise ValueError(f"{name}: fields other than `data` differ between stream parts")
        if self.out is None:
            self._copy(self._reserve(self.received), self._first_batch(), 0)
        out = self._reserve(offset + len(payload.data))
        self._copy(out, payload.data, offset)
        out.meta_info = merge_meta([out.meta_info, payload.data.meta_info])
        self.received += len(payload.data)

    def result(self) -> Payload:
        if self.first is None:
            raise ValueError(f"{self.cls.DESCRIPTOR.full_name}: empty stream")
        if self.total and self.received != self.total:
            raise ValueError(
                f"{self.cls.DESCRIPTOR.full_name}: stream ended after {self.received} of {self.total} rows (truncated)"
            )
        if self.out is None:
            return self.first
        return Payload(self.first.msg, self.out)

    def _check_declared(self, first: DataProto, total: int) -> None:
        """The declared rows at the first part's bytes per row (a pointer per column value) within max_bytes."""
        row_bytes = sum(math.prod(t.shape[1:]) * t.element_size() for t in first.batch.values())
        row_bytes += 8 * len(first.non_tensor_batch)
        if total * row_bytes > self.max_bytes:
            raise ValueError(
                f"{self.cls.DESCRIPTOR.full_name}: data.total_rows = {total} rows of {row_bytes} "
                f"bytes would take {total * row_bytes} bytes, past this service's limit of "
                f"{self.max_bytes} bytes for one batch"
            )

    def _first_batch(self) -> DataProto:
        """The first part's batch: a stream (total_rows > 0) always starts with one (decode_message)."""
        assert self.first is not None and self.first.data is not None
        return self.first.data

    def _reserve(self, rows: int) -> DataProto:
        """Room for `rows` rows (returns self.out). Capacity grows 4x at a time as rows come in (never past the
        declared total), so a few bytes declaring 2^27 rows cost a few rows, and an honest stream copies a third
        of its rows once more (x2 steps measured no faster here: more fresh pages to fault in)."""
        if self.out is not None and rows <= self.capacity:
            return self.out
        capacity = min(self.total, max(rows, 4 * self.capacity))
        old, out = self.out, _allocate(self._first_batch(), capacity)
        self.out = out
        if old is not None:
            n = self.received
            for k, t in old.batch.items():
                _copy_rows(out.batch[k][:n], t[:n])
            for k, v in old.non_tensor_batch.items():
                out.non_tensor_batch[k][:n] = v[:n]
            out.meta_info = old.meta_info
        self.capacity = capacity
        return out

    def _copy(self, out: DataProto, part: DataProto, offset: int) -> None:
        if set(part.batch) != set(out.batch) or set(part.non_tensor_batch) != set(out.non_tensor_batch):
            raise ValueError(
                f"stream part at row {offset} has fields {sorted(part.batch)} + "
                f"{sorted(part.non_tensor_batch)}, the first part has {sorted(out.batch)} + "
                f"{sorted(out.non_tensor_batch)}"
            )
        end = offset + len(part)
        if end > self.total:
            raise ValueError(f"stream part holds rows up to {end}, but the batch has {self.total}")
        for k, t in part.batch.items():
            dst = out.batch[k]
            if t.dtype != dst.dtype or t.shape[1:] != dst.shape[1:]:
                raise ValueError(
                    f"tensor {k!r}: part at row {offset} is {t.dtype} {list(t.shape)}, "
                    f"the first part is {dst.dtype} {list(dst.shape)}"
                )
            _copy_rows(dst[offset:end], t)
        for k, v in part.non_tensor_batch.items():
            out.non_tensor_batch[k][offset:end] = v


def _copy_rows(dst: torch.Tensor, src: torch.Tensor) -> None:
    """A plain memcpy of contiguous rows. torch's copy_ splits even 4 MB over its OpenMP threads,
    whose spin-waiting fights gRPC's threads for two cores (measured: ~40% slower assembly);
    numpy copies in one thread with the GIL released."""
    if src.numel():
        np.copyto(dst.reshape(-1).view(torch.uint8).numpy(), src.reshape(-1).view(torch.uint8).numpy())


def _allocate(first: DataProto, total: int) -> DataProto:
    out = DataProto(meta_info=first.meta_info)
    # Fill the dicts directly: rows are written in as the parts arrive.
    out.batch = {k: torch.empty((total, *t.shape[1:]), dtype=t.dtype) for k, t in first.batch.items()}
    out.non_tensor_batch = {k: np.empty(total, dtype=object) for k in first.non_tensor_batch}
    return out


def _row_bytes(data: DataProto, packed: bool, samples: int = 32) -> int:
    """Bytes per row on the wire: for tensors, exact when plain, and when packed the bytes per row of the
    first PACK_SAMPLE rows packed; for columns, the largest of up to `samples` rows spread over the batch
    (rows of text vary, and a chunk must not balloon)."""
    n = sum(t[0].numel() * t.element_size() for t in data.batch.values())
    if packed and data.batch:
        head = DataProto(data.slice(0, PACK_SAMPLE).batch)
        n = min(n, -(-sum(map(len, encode_dataproto(head))) // len(head)))
    picks = range(0, len(data), max(1, len(data) // samples))
    return n + sum(max(to_value(v[i], k).ByteSize() for i in picks) + 4 for k, v in data.non_tensor_batch.items())
