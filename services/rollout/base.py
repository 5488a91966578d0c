"""The rollout's side of delta pushes (meshrl/delta.py): the weights as last received, kept in a /dev/shm
segment that the engine reads a bucket's tensors from, as it reads them from the staging segment.

A full push that keeps a base places each tensor in the segment as it arrives (the segment is the push's
announced total, the model's size in the rollout's dtype: the memory rollout.push=delta costs); a delta
push applies each tensor's changes there in place. Either way every tensor of the bucket is then loaded
from the base, and its checksum checked against the sender's first: a mismatch is DATA_LOSS, the base is
no version's, and only a full push starts it again.
"""

import math
from collections.abc import Callable

import torch

from meshrl.delta import SPARSE, WHOLE, aligned, checksum, index_dtype
from meshrl.errors import DataLoss, InvalidArgument
from meshrl.shm import Segment
from meshrl.weights import ref_dtype

Read = Callable[[torch.dtype, list[int], int], torch.Tensor]  # (dtype, shape, offset) -> a view of the bucket


class Base:
    def __init__(self) -> None:
        self.segment: Segment | None = None
        self.where: dict[str, tuple[torch.dtype, list[int], int]] = {}  # name -> (dtype, shape, offset)
        self.end = 0  # bytes placed
        self.version = 0  # 0: none whole (none kept yet, or an update in flight or broken off)

    @property
    def name(self) -> str:
        return self.segment.name if self.segment is not None else ""

    def start(self, total: int) -> None:
        """A full push that keeps a base: room for `total` bytes (every tensor, aligned), placed anew."""
        if self.segment is None or self.segment.size < total:
            self.drop()
            self.segment = Segment.create(total, prefix="meshrl-base")
        self.where, self.end, self.version = {}, 0, 0

    def drop(self) -> None:
        if self.segment is not None:
            self.segment.unlink()
            self.segment = None
        self.where, self.end, self.version = {}, 0, 0

    def take(self, refs: list, read: Read) -> list[list]:
        """Apply one bucket's tensors (read views the bytes received) to the base; the refs to load each
        tensor from it, [name, dtype, shape, offset]. Every ref is a tensor of the model, checked."""
        out = []
        for ref in refs:
            dtype, shape = ref_dtype(ref), list(ref.shape)
            held, offset = self._held(ref.name, dtype, shape)
            if ref.delta == WHOLE:
                held.copy_(read(dtype, shape, ref.offset))
            elif ref.delta == SPARSE:
                self._scatter(ref, held, read)
            if ref.HasField("checksum") and (got := checksum(held)) != ref.checksum:
                raise DataLoss(
                    f"tensor {ref.name!r} has checksum {got:#018x} after the update, the sender's is "
                    f"{ref.checksum:#018x}: the rollout's base no longer matches the sender's; a full push repairs it"
                )
            out.append([ref.name, str(dtype).removeprefix("torch."), shape, offset])
        return out

    def _held(self, name: str, dtype: torch.dtype, shape: list[int]) -> tuple[torch.Tensor, int]:
        """The base's tensor `name` (placed now if it is new) and its offset."""
        at = self.where.get(name)
        if at is None:
            assert self.segment is not None  # start() made it before any bucket came
            size = aligned(math.prod(shape) * dtype.itemsize)
            if self.end + size > self.segment.size:
                raise InvalidArgument(f"tensor {name!r} runs past the push's announced total_bytes")
            at = self.where[name] = (dtype, shape, self.end)
            self.end += size
        elif at[:2] != (dtype, shape):
            raise DataLoss(f"tensor {name!r} came as {dtype} {shape}, the base holds {at[0]} {at[1]}")
        assert self.segment is not None
        return self.segment.tensor(dtype, shape, at[2]), at[2]

    @staticmethod
    def _scatter(ref, held: torch.Tensor, read: Read) -> None:
        numel = held.numel()
        index = read(index_dtype(numel), [ref.count], ref.index_offset).long()
        if ref.count and (int(index.min()) < 0 or int(index.max()) >= numel):
            raise InvalidArgument(f"tensor {ref.name!r}: a changed element's index is outside its {numel} elements")
        held.view(-1)[index] = read(held.dtype, [ref.count], ref.offset)
