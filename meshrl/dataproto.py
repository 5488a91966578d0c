"""DataProto: the batch every algorithm and service passes around.

A batch of N rows, as in verl: `batch` holds tensors whose first dimension is N,
`non_tensor_batch` holds 1-D numpy object arrays of N per-row values (strings,
numbers, dicts such as reward_model = {"ground_truth": "42"}), and `meta_info`
holds batch-wide values. Operations return new DataProtos; tensors are shared
(views) where the operation allows, never copied behind the caller's back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

Index = int | slice | Sequence[int] | np.ndarray | torch.Tensor


def object_array(values: Iterable[Any]) -> np.ndarray:
    """A 1-D object array of the given values, never a 2-D one.

    np.array(list_of_equal_length_lists, dtype=object) would build a 2-D array;
    per-row values such as chat message lists must stay one object per row.
    """
    values = list(values)
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out


@dataclasses.dataclass
class DataProtoItem:
    """One row: dataproto[i]."""

    batch: dict[str, torch.Tensor]
    non_tensor_batch: dict[str, Any]
    meta_info: dict[str, Any]


@dataclasses.dataclass(init=False)
class DataProto:
    batch: dict[str, torch.Tensor]
    non_tensor_batch: dict[str, np.ndarray]  # each a 1-D object array
    meta_info: dict[str, Any]

    def __init__(
        self,
        batch: Mapping[str, torch.Tensor] | None = None,
        non_tensor_batch: Mapping[str, Iterable[Any]] | None = None,
        meta_info: Mapping[str, Any] | None = None,
    ):
        """A column may come as any iterable of its rows' values (a list, an array): it is stored as a 1-D
        object array (a 1-D object array as it is, not copied)."""
        self.batch = dict(batch or {})
        self.non_tensor_batch = {
            k: v if isinstance(v, np.ndarray) and v.dtype == object and v.ndim == 1 else object_array(v)
            for k, v in (non_tensor_batch or {}).items()
        }
        self.meta_info = dict(meta_info or {})
        self.check_consistency()

    # ---- construction -------------------------------------------------------------

    @classmethod
    def from_dict(cls, tensors=None, non_tensors=None, meta_info=None) -> DataProto:
        return cls(tensors or {}, non_tensors or {}, meta_info or {})

    @classmethod
    def from_single_dict(cls, data: dict[str, Any], meta_info=None) -> DataProto:
        """Tensors go to `batch`, everything else (lists, arrays) to `non_tensor_batch`."""
        tensors = {k: v for k, v in data.items() if isinstance(v, torch.Tensor)}
        others = {k: v for k, v in data.items() if not isinstance(v, torch.Tensor)}
        return cls(tensors, others, meta_info or {})

    # ---- shape ------------------------------------------------------------------

    def __len__(self) -> int:
        for t in self.batch.values():
            return t.shape[0]
        for v in self.non_tensor_batch.values():
            return len(v)
        return 0

    def has_rows(self) -> bool:
        """True when there is any tensor or column (a meta-only DataProto has none)."""
        return bool(self.batch or self.non_tensor_batch)

    def check_consistency(self) -> None:
        """Every tensor and column has the same number of rows; raises ValueError naming the field."""
        for k, t in self.batch.items():
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"batch[{k!r}] is a {type(t).__name__}, not a torch.Tensor")
            if t.dim() == 0:
                raise ValueError(f"batch[{k!r}] is a scalar; tensors need a first (row) dimension")
        n = len(self)
        for k, t in self.batch.items():
            if t.shape[0] != n:
                raise ValueError(f"batch[{k!r}] has {t.shape[0]} rows but the batch has {n}")
        for k, v in self.non_tensor_batch.items():
            if len(v) != n:
                raise ValueError(f"non_tensor_batch[{k!r}] has {len(v)} rows but the batch has {n}")

    # ---- keys ---------------------------------------------------------------------

    def select(self, batch_keys=None, non_tensor_batch_keys=None, meta_info_keys=None) -> DataProto:
        """A DataProto with only the named keys (None keeps all of that kind)."""
        return DataProto(
            _pick(self.batch, batch_keys, "batch"),
            _pick(self.non_tensor_batch, non_tensor_batch_keys, "non_tensor_batch"),
            _pick(self.meta_info, meta_info_keys, "meta_info"),
        )

    def pop(self, batch_keys=(), non_tensor_batch_keys=(), meta_info_keys=()) -> DataProto:
        """Remove the named keys from self and return them as a DataProto."""
        out = self.select(list(batch_keys), list(non_tensor_batch_keys), list(meta_info_keys))
        for k in batch_keys:
            del self.batch[k]
        for k in non_tensor_batch_keys:
            del self.non_tensor_batch[k]
        for k in meta_info_keys:
            del self.meta_info[k]
        return out

    def rename(self, old_keys: str | Sequence[str], new_keys: str | Sequence[str]) -> DataProto:
        """Rename tensors in place (verl renames batch keys only); returns self."""
        old_keys = [old_keys] if isinstance(old_keys, str) else list(old_keys)
        new_keys = [new_keys] if isinstance(new_keys, str) else list(new_keys)
        if len(old_keys) != len(new_keys):
            raise ValueError(f"rename: {len(old_keys)} old keys but {len(new_keys)} new keys")
        moved = {new: self.batch[old] for old, new in zip(old_keys, new_keys)}
        for old in old_keys:
            del self.batch[old]
        clash = set(moved) & set(self.batch)
        if clash:
            raise ValueError(f"rename: keys already present: {sorted(clash)}")
        self.batch.update(moved)
        return self

    def union(self, other: DataProto) -> DataProto:
        """Merge other's keys into self (in place, returns self); equal keys must hold equal values."""
        if self.has_rows() and other.has_rows() and len(self) != len(other):
            raise ValueError(f"union: batches have {len(self)} and {len(other)} rows")
        # Check everything before changing anything, so a failed union leaves self as it was.
        for k, t in other.batch.items():
            if k in self.batch and not _same_tensor(self.batch[k], t):
                raise ValueError(f"union: batch[{k!r}] differs between the two batches")
        for k, v in other.non_tensor_batch.items():
            if k in self.non_tensor_batch and not _same_column(self.non_tensor_batch[k], v):
                raise ValueError(f"union: non_tensor_batch[{k!r}] differs between the two batches")
        meta = merge_meta([self.meta_info, other.meta_info])
        self.batch.update(other.batch)
        self.non_tensor_batch.update(other.non_tensor_batch)
        self.meta_info = meta
        return self

    # ---- rows ---------------------------------------------------------------------

    def __getitem__(self, idx: Index) -> DataProto | DataProtoItem:
        if isinstance(idx, (int, np.integer)):
            i = int(idx)
            return DataProtoItem(
                {k: t[i] for k, t in self.batch.items()},
                {k: v[i] for k, v in self.non_tensor_batch.items()},
                self.meta_info,
            )
        if isinstance(idx, slice):
            return self.slice(idx.start, idx.stop, idx.step)
        return self.select_idxs(idx)

    def slice(self, start=None, end=None, step=None) -> DataProto:
        """Rows start:end:step as views (no copy)."""
        s = slice(start, end, step)
        return DataProto(
            {k: t[s] for k, t in self.batch.items()},
            {k: v[s] for k, v in self.non_tensor_batch.items()},
            self.meta_info,
        )

    def select_idxs(self, idxs) -> DataProto:
        """Rows by integer indices or a boolean mask (copies, like any gather)."""
        idx = np.asarray(idxs.cpu() if isinstance(idxs, torch.Tensor) else idxs)
        if idx.dtype == bool:
            if idx.shape != (len(self),):
                raise ValueError(f"boolean mask has shape {idx.shape}, batch has {len(self)} rows")
            idx = np.nonzero(idx)[0]
        idx = idx.astype(np.int64).reshape(-1)
        t_idx = torch.from_numpy(idx)
        return DataProto(
            {k: t[t_idx.to(t.device)] for k, t in self.batch.items()},
            {k: v[idx] for k, v in self.non_tensor_batch.items()},
            self.meta_info,
        )

    def chunk(self, chunks: int) -> list[DataProto]:
        """Split into `chunks` equal parts; the rows must divide evenly (see pad_to_divisor)."""
        if chunks <= 0:
            raise ValueError(f"chunk: chunks must be positive, got {chunks}")
        if len(self) % chunks:
            raise ValueError(f"chunk: {len(self)} rows do not split into {chunks} equal chunks; pad first")
        size = len(self) // chunks
        return [self.slice(i * size, (i + 1) * size) for i in range(chunks)]

    def split(self, split_size: int) -> list[DataProto]:
        """Consecutive parts of split_size rows; the last may be shorter."""
        if split_size <= 0:
            raise ValueError(f"split: split_size must be positive, got {split_size}")
        return [self.slice(i, i + split_size) for i in range(0, len(self), split_size)]

    @staticmethod
    def concat(data: Sequence[DataProto]) -> DataProto:
        """Rows of all parts in order; the parts must have the same keys and agreeing meta."""
        if not data:
            raise ValueError("concat: nothing to concatenate")
        keys = set(data[0].batch), set(data[0].non_tensor_batch)
        for i, d in enumerate(data[1:], 1):
            if (set(d.batch), set(d.non_tensor_batch)) != keys:
                raise ValueError(
                    f"concat: part {i} has keys {sorted(d.batch)}/{sorted(d.non_tensor_batch)}, "
                    f"part 0 has {sorted(keys[0])}/{sorted(keys[1])}"
                )
        return DataProto(
            {k: torch.cat([d.batch[k] for d in data]) for k in data[0].batch},
            {k: np.concatenate([d.non_tensor_batch[k] for d in data]) for k in data[0].non_tensor_batch},
            merge_meta([d.meta_info for d in data]),
        )

    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> DataProto:
        """Each row repeat_times times: a a b b (interleave) or a b a b."""
        if repeat_times < 1:
            raise ValueError(f"repeat: repeat_times must be >= 1, got {repeat_times}")
        if interleave:
            tensors = {k: t.repeat_interleave(repeat_times, dim=0) for k, t in self.batch.items()}
            others = {k: np.repeat(v, repeat_times) for k, v in self.non_tensor_batch.items()}
        else:
            tensors = {k: t.repeat(repeat_times, *[1] * (t.dim() - 1)) for k, t in self.batch.items()}
            others = {k: np.tile(v, repeat_times) for k, v in self.non_tensor_batch.items()}
        return DataProto(tensors, others, self.meta_info)

    def to(self, device) -> DataProto:
        return DataProto({k: t.to(device) for k, t in self.batch.items()}, self.non_tensor_batch, self.meta_info)

    def __repr__(self) -> str:
        tensors = ", ".join(
            f"{k}: {tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}" for k, t in self.batch.items()
        )
        return (
            f"DataProto(rows={len(self)}, batch={{{tensors}}}, "
            f"non_tensor_batch={sorted(self.non_tensor_batch)}, meta_info={sorted(self.meta_info)})"
        )


def pad_to_divisor(data: DataProto, divisor: int) -> tuple[DataProto, int]:
    """Append rows (repeated from the start) so len is a multiple of divisor; returns (padded, pad_size)."""
    if divisor <= 0:
        raise ValueError(f"pad_to_divisor: divisor must be positive, got {divisor}")
    if len(data) == 0:
        raise ValueError("pad_to_divisor: cannot pad an empty batch")
    pad_size = -len(data) % divisor
    if pad_size == 0:
        return data, 0
    reps = [data] * (pad_size // len(data)) + [data.slice(0, pad_size % len(data))]
    return DataProto.concat([data, *reps]), pad_size


def unpad(data: DataProto, pad_size: int) -> DataProto:
    """Drop the pad_size rows that pad_to_divisor appended."""
    return data.slice(0, len(data) - pad_size) if pad_size else data


def merge_meta(metas: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Union of meta dicts; a key present in several must hold equal values."""
    out: dict[str, Any] = {}
    for m in metas:
        for k, v in m.items():
            if k in out and not _equal_values(out[k], v):
                raise ValueError(f"meta_info[{k!r}] disagrees between parts: {out[k]!r} vs {v!r}")
            out[k] = v
    return out


def _pick(d: dict, keys, kind: str) -> dict:
    if keys is None:
        return dict(d)
    missing = [k for k in keys if k not in d]
    if missing:
        raise KeyError(f"{kind} has no key(s) {missing}; present: {sorted(d)}")
    return {k: d[k] for k in keys}


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a is b or (a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b))


def _same_column(a: np.ndarray, b: np.ndarray) -> bool:
    return a is b or (len(a) == len(b) and all(_equal_values(x, y) for x, y in zip(a, b)))


def _equal_values(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and _same_tensor(a, b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return bool(np.array_equal(np.asarray(a, dtype=object), np.asarray(b, dtype=object)))
    return bool(a == b)
