"""DataProto <-> the bytes of a meshrl.v1.DataProto message, with no copy of tensor data on decode.

Plain protobuf copies a tensor's bytes several times (tobytes, message
construction, serialize, parse, field access; ~0.36 GB/s here). This writer
emits the same wire format as a list of buffers in which tensor data are
memoryviews of the tensors themselves (the caller joins them once), and pads
each tensor so its data lands 64-byte aligned in the received buffer. The
reader scans the fields by hand and views tensor data in place with
torch.frombuffer. Everything that is not tensor data goes through protobuf.

Decoded tensors share memory with the buffer they came from; a gRPC request
buffer belongs to nobody else, so writing to them is safe.
"""

import math
import sys
import warnings
from typing import Any

import torch

from meshrl.codec import protowire as w
from meshrl.codec.dtypes import torch_dtype, wire_dtype
from meshrl.codec.packing import pack, unpack
from meshrl.codec.values import from_column, from_value, to_column, to_value
from meshrl.dataproto import DataProto, object_array
from meshrl.v1 import data_pb2 as pb

if sys.byteorder != "little":  # the wire is little-endian and we view bytes in place
    raise ImportError("meshrl's wire codec needs a little-endian machine")

ALIGN = 64
_TENSORS = pb.DataProto.DESCRIPTOR.fields_by_name["tensors"].number
_PACKED = pb.DataProto.DESCRIPTOR.fields_by_name["packed"].number
_PAD = pb.Tensor.DESCRIPTOR.fields_by_name["pad"].number
_DATA = pb.Tensor.DESCRIPTOR.fields_by_name["data"].number

Buffer = bytes | bytearray | memoryview


Packed = tuple[dict[str, torch.Tensor], pb.Packing | None, dict[str, torch.Tensor]]


def packed_tensors(data: DataProto, packed: bool = True) -> Packed:
    """(plain tensors, Packing or None, packed arrays): what encode_dataproto writes; packed=False writes
    every tensor plain (for readers that know only `tensors`)."""
    for name, t in data.batch.items():
        _tensor_header(name, t)  # a bad name or type is refused by name before packing looks at it
    return pack(data.batch) if packed else (data.batch, None, {})


def encode_dataproto(
    data: DataProto,
    *,
    base_offset: int = 0,
    row_offset: int = 0,
    total_rows: int = 0,
    packed: bool | Packed = True,
) -> list[Buffer]:
    """The message as buffers to join; base_offset is where it will start in the final buffer. `packed`:
    as packed_tensors, or what it returned for this batch."""
    plain, packing, arrays = packed if isinstance(packed, tuple) else packed_tensors(data, packed)
    small = _small_fields(data, row_offset, total_rows)
    if packing is not None:
        small.packing.CopyFrom(packing)
    parts: list[Buffer] = [small.SerializeToString()]
    pos = base_offset + len(parts[0])
    for field, tensors in ((_TENSORS, plain), (_PACKED, arrays)):
        for name, t in tensors.items():
            header, raw = _tensor_header(name, t), tensor_bytes(t, name)
            pad = _pad_for(pos, header, len(raw))
            body = header + pad + w.len_prefix(_DATA, len(raw))
            prefix = w.len_prefix(field, len(body) + len(raw))
            parts += [prefix + body, raw]
            pos += len(prefix) + len(body) + len(raw)
    return parts


def decode_dataproto(buf: Buffer, start: int = 0, end: int | None = None) -> tuple[DataProto, int, int]:
    """Parse buf[start:end]; returns (data, row_offset, total_rows). ValueError names the bad field."""
    mv = memoryview(buf).cast("B") if not isinstance(buf, memoryview) or buf.format != "B" else buf
    end = len(mv) if end is None else end
    small: list[memoryview] = []
    spans: dict[int, list[tuple[int, int]]] = {_TENSORS: [], _PACKED: []}
    for f in w.scan(mv, start, end):
        if f.number in spans and f.wire_type == w.LEN:
            spans[f.number].append((f.value_start, f.end))
        else:
            small.append(mv[f.start : f.end])
    msg = pb.DataProto.FromString(b"".join(small))
    tensors, arrays = _decode_tensors(mv, spans[_TENSORS], "tensor"), _decode_tensors(mv, spans[_PACKED], "packed")
    if msg.HasField("packing"):
        for name, t in unpack(msg.packing, arrays, msg.num_rows, end - start).items():
            if name in tensors:
                raise ValueError(f"tensor {name!r} appears twice (plain and packed)")
            tensors[name] = t
    elif arrays:
        raise ValueError(f"packed arrays {sorted(arrays)} without a `packing` to read them by")
    non_tensors = {k: from_column(col, f"non_tensor {k!r}") for k, col in msg.non_tensors.items()}
    meta = {k: from_value(v, f"meta {k!r}") for k, v in msg.meta.items()}
    _check_rows(msg.num_rows, tensors, non_tensors)
    clash = set(tensors) & set(non_tensors)
    if clash:
        raise ValueError(f"field(s) {sorted(clash)} are both tensors and non-tensors")
    columns = {k: object_array(v) for k, v in non_tensors.items()}
    return DataProto(tensors, columns, meta), msg.row_offset, msg.total_rows


def _decode_tensors(mv: memoryview, spans: list[tuple[int, int]], what: str) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*buffer is not writable.*")
        for i, (a, b) in enumerate(spans):
            name, t = _decode_tensor(mv, a, b, i)
            if name in tensors:
                raise ValueError(f"{what} {name!r} appears twice")
            tensors[name] = t
    return tensors


def to_proto(data: DataProto) -> pb.DataProto:
    """The plain protobuf message (copies the data; for interop with generated stubs)."""
    return pb.DataProto.FromString(b"".join(encode_dataproto(data)))


def from_proto(msg: pb.DataProto) -> DataProto:
    return decode_dataproto(msg.SerializeToString())[0]


def _small_fields(data: DataProto, row_offset: int, total_rows: int) -> pb.DataProto:
    msg = pb.DataProto(num_rows=len(data), row_offset=row_offset, total_rows=total_rows)
    for k, col in data.non_tensor_batch.items():
        if k in data.batch:
            raise ValueError(f"field {k!r} is both a tensor and a non-tensor")
        msg.non_tensors[k].CopyFrom(to_column(col.tolist(), f"non_tensor {k!r}"))
    for k, x in data.meta_info.items():
        msg.meta[k].CopyFrom(to_value(x, f"meta {k!r}"))
    return msg


def _tensor_header(name: str, t: Any) -> bytes:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"tensor {name!r}: a {type(t).__name__} is not a torch.Tensor")
    if not name:
        raise ValueError("a tensor needs a non-empty name")
    return pb.Tensor(name=name, dtype=wire_dtype(t.dtype, name), shape=list(t.shape)).SerializeToString()


def tensor_bytes(t: torch.Tensor, name: str = "tensor") -> memoryview:
    """The tensor's bytes without copying when it is already contiguous on the CPU."""
    if t.is_sparse or t.is_quantized:
        raise ValueError(f"tensor {name!r}: only dense tensors can travel")
    t = t.detach().to("cpu").contiguous().view(-1)
    if t.numel() == 0:
        return memoryview(b"")
    if t.stride(0) != 1:  # one element at any stride counts as contiguous to torch; bytes need stride 1
        t = t.clone(memory_format=torch.contiguous_format)
    # numpy's stubs give ndarray its buffer protocol (__buffer__) only for Python 3.12 on
    return memoryview(t.view(torch.uint8).numpy())  # type: ignore[arg-type]


def _pad_for(pos: int, header: bytes, nbytes: int) -> bytes:
    """A pad field that puts the data of a tensor written at `pos` on an ALIGN boundary."""
    total = 0  # bytes of the pad field, tag and length included
    for _ in range(4):  # the length varints can grow with the pad; settles in one or two rounds
        body = len(header) + total + len(w.len_prefix(_DATA, nbytes))
        data_at = pos + len(w.len_prefix(_TENSORS, body + nbytes)) + body
        need = -data_at % ALIGN
        if need == 0:
            break
        total += need if need >= 2 or total else need + ALIGN  # the smallest field is 2 bytes
    if total == 0:
        return b""
    content = total - 2  # tag and a one-byte length: total stays below 2 * ALIGN + 2 < 129
    return w.len_prefix(_PAD, content) + bytes(content)


def _decode_tensor(mv: memoryview, start: int, end: int, index: int) -> tuple[str, torch.Tensor]:
    header, data = [], None
    for f in w.scan(mv, start, end):
        if f.number == _DATA and f.wire_type == w.LEN:
            if data is not None:
                raise ValueError(f"tensor #{index}: data field appears twice")
            data = (f.value_start, f.end)
        elif f.number != _PAD:
            header.append(mv[f.start : f.end])
    h = pb.Tensor.FromString(b"".join(header))
    name = h.name or f"#{index}"
    if not h.name:
        raise ValueError(f"tensor #{index} has no name")
    dtype = torch_dtype(h.dtype, name)
    shape = list(h.shape)
    if not shape:
        raise ValueError(f"tensor {name!r}: scalar; tensors need a first (row) dimension")
    if any(d < 0 for d in shape):
        raise ValueError(f"tensor {name!r}: negative dimension in shape {shape}")
    numel = math.prod(shape)
    itemsize = torch.empty((), dtype=dtype).element_size()
    a, b = data if data is not None else (start, start)
    if b - a != numel * itemsize:
        raise ValueError(
            f"tensor {name!r}: {b - a} bytes of data do not match shape {shape} of "
            f"{str(dtype).removeprefix('torch.')} ({numel * itemsize} bytes)"
        )
    if numel == 0:
        return name, torch.empty(shape, dtype=dtype)
    t = torch.frombuffer(mv, dtype=dtype, count=numel, offset=a)
    if t.data_ptr() % itemsize:  # unaligned: copy rather than hand kernels a misaligned pointer
        t = t.clone()
    # numpy's max: one pass, no temporary, no OpenMP threads (see payload._copy_rows)
    if dtype == torch.bool and t.view(torch.uint8).numpy().max() > 1:
        raise ValueError(f"tensor {name!r}: bool data holds bytes other than 0 and 1")
    return name, t.view(shape)


def _check_rows(num_rows: int, tensors: dict, non_tensors: dict) -> None:
    rows = {f"tensor {k!r}": t.shape[0] for k, t in tensors.items()}
    rows |= {f"non_tensor {k!r}": len(v) for k, v in non_tensors.items()}
    if num_rows == 0 and rows:
        num_rows = next(iter(rows.values()))  # writers that leave num_rows unset
    for where, n in rows.items():
        if n != num_rows:
            raise ValueError(
                f"{where} has {n} rows but the batch has {num_rows} (rows disagree on the first dimension)"
            )
