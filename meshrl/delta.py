"""Delta weight pushes: each push sends only the elements that changed since the last, checked on arrival.

With a bf16 rollout only a few percent of the weights' bf16 values change in a step at a realistic
learning rate (the fp32 master moves by about lr, a bf16 value only when that crosses a rounding
boundary), so sending every tensor whole moves ~30x the bytes that carry news. Both sides keep a base:
the weights as last pushed, in the rollout's dtype (the actor's rank 0 on the CPU, `Base`; the rollout in a
/dev/shm segment its engine reads from, services/rollout/base.py). A delta push compares each new tensor
with the base bit for bit (so -0.0, NaN and every rounding count) and sends it as one of:

- SAME: unchanged, nothing but its ref;
- SPARSE: the changed elements' values (the rollout's dtype) and flat indices (int32, int64 past 2^31
  elements), where that is smaller than the tensor;
- WHOLE: the tensor, where most of it changed.

Every ref carries a checksum (XXH3-64) of the tensor's bytes after the update; the rollout checks it against its
own base, and a mismatch is DATA_LOSS, after which the sender pushes the full weights. A rollout whose base
is not the version the delta is from (it restarted, joined late, missed a push, holds a torn update)
refuses the Begin with ABORTED and takes a full push instead. The base's version is 0 while a push is in
flight and stays 0 after one that did not end, so a half-applied base is never the start of a delta.

This is a wire saving, not a load saving: the rollout still loads every tensor of a bucket into its engine
(from its base), exactly as a full push would, so what the engine holds is bit for bit a full push's.
"""

import math
from dataclasses import dataclass

import torch
import xxhash

from meshrl.codec.frame import tensor_bytes
from meshrl.v1 import rollout_pb2

WHOLE, SPARSE, SAME = rollout_pb2.TensorRef.WHOLE, rollout_pb2.TensorRef.SPARSE, rollout_pb2.TensorRef.SAME
ALIGN = 64  # meshrl.weights.ALIGN: each part of a bucket starts on it
BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # a float's bits, compared as integers


def aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def index_dtype(numel: int) -> torch.dtype:
    return torch.int32 if numel < 2**31 else torch.int64


def checksum(t: torch.Tensor) -> int:
    """XXH3-64 of a tensor's bytes: ~18 GB/s here, where zlib's CRC-32 made ~4 (a quarter second per GB on
    each side of every push)."""
    return xxhash.xxh3_64_intdigest(tensor_bytes(t))


def payload_nbytes(ref: rollout_pb2.TensorRef, itemsize: int) -> int:
    """Bytes a ref's tensor takes on the wire."""
    if ref.delta == SAME:
        return 0
    if ref.delta == SPARSE:
        return ref.count * (itemsize + index_dtype(math.prod(ref.shape)).itemsize)
    return math.prod(ref.shape) * itemsize


@dataclass
class Part:
    """One run of bytes of a bucket on the wire: a tensor's values (or a sparse tensor's indices) at offset."""

    name: str
    tensor: torch.Tensor
    offset: int


@dataclass
class Payload:
    """A bucket as it travels: its refs (offsets of the parts, not of the full layout) and its parts."""

    refs: list
    size: int
    parts: list[Part]

    @property
    def num_bytes(self) -> int:
        return sum(p.tensor.numel() * p.tensor.element_size() for p in self.parts)


def whole(refs: list, size: int, tensors: list[torch.Tensor]) -> Payload:
    """A bucket sent as it is, every tensor at its ref's offset."""
    return Payload(refs, size, [Part(r.name, t, r.offset) for r, t in zip(refs, tensors)])


class Base:
    """The sender's side: the weights as last pushed (the rollout's dtype, on the CPU) and their version."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self.version = 0  # 0: no push ended since the base last changed; nothing can be sent as a delta

    def encode(self, refs: list, tensors: list[torch.Tensor], delta: bool) -> Payload:
        """One bucket (refs in the full layout, tensors in their order) as it travels: each tensor's changes
        against the base when `delta`, else whole; the base takes the new values either way."""
        out: list = []
        parts: list[Part] = []
        size = 0
        for ref, t in zip(refs, tensors):
            t = t.detach().to("cpu").contiguous()
            sent = rollout_pb2.TensorRef()
            sent.CopyFrom(ref)
            sent.checksum = checksum(t)
            held = self.tensors.get(ref.name)
            if held is None or held.shape != t.shape or held.dtype != t.dtype:
                held = self.tensors[ref.name] = torch.empty_like(t)
                changed = None  # nothing to compare with: whole
            else:
                changed = _changed(held, t) if delta else None
            size = _place(sent, t, changed, parts, size)
            held.copy_(t)
            out.append(sent)
        return Payload(out, size, parts)


def _changed(held: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """Flat indices of the elements whose bits differ."""
    bits = BITS[new.element_size()]
    return (held.view(bits) != new.view(bits)).view(-1).nonzero().view(-1)


def _place(ref, t: torch.Tensor, changed: torch.Tensor | None, parts: list[Part], size: int) -> int:
    """Set how ref's tensor travels, append its parts at `size`; the bucket's size after them."""
    whole_bytes = aligned(t.numel() * t.element_size())
    if changed is not None and changed.numel() == 0:
        ref.delta, ref.offset = SAME, 0
        return size
    if changed is not None:
        k, index = changed.numel(), index_dtype(t.numel())
        values_bytes, index_bytes = aligned(k * t.element_size()), aligned(k * index.itemsize)
        if values_bytes + index_bytes < whole_bytes:
            ref.delta, ref.count, ref.offset, ref.index_offset = SPARSE, k, size, size + values_bytes
            parts.append(Part(ref.name, t.view(-1)[changed], size))
            parts.append(Part(ref.name, changed.to(index), size + values_bytes))
            return size + values_bytes + index_bytes
    ref.delta, ref.offset = WHOLE, size
    parts.append(Part(ref.name, t, size))
    return size + whole_bytes
