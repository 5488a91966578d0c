"""Packed tensors: verl's padded token layout and the tensors aligned with the responses, written once and
unpadded, and rebuilt exactly by the reader (docs/wire.md, "Packed tensors").

A rollout's batch holds the same token ids three times (prompts, responses, input_ids), padded to the
widest row, as int64, with masks and positions a reader can derive, and every group's prompt repeated per
sample. The writer checks, for the batch it is given, that each layout tensor is what the rule rebuilds
(one contiguous span of ones per row in attention_mask, input_ids = prompts | responses, one pad id,
positions = the mask's running count), and sends only:

- the token ids as int32: each distinct prompt once (rows of a group share theirs) and each response;
- the lengths that rebuild every mask and position;
- for every (N, T) tensor that is 0 past each response (log-probs, advantages, masks, values): each row's
  values up to its length, or one value per row where the row is constant (GRPO's advantages, an all-ones
  mask), and 0/1 values as uint8.

Anything that does not fit the rules travels as a plain tensor, so packing never changes what is received.
"""

import dataclasses
import functools

import numpy as np
import torch

from meshrl.codec.dtypes import torch_dtype, wire_dtype
from meshrl.v1 import data_pb2 as pb

LAYOUT = ("prompts", "responses", "input_ids", "attention_mask", "position_ids")
ARRAYS = ("prompt_lengths", "prompt_rows", "prompt_tokens", "response_lengths", "response_tokens")
# A reader rebuilds at most this many bytes per byte received (plus REBUILT_FLOOR): a long-tailed batch,
# padded to its longest response, rebuilds a few hundred times its packed size; a hostile message that
# declares huge widths is refused before anything is allocated.
REBUILT_PER_BYTE = 1024
REBUILT_FLOOR = 256 << 20
ARRAY_OVERHEAD = 96  # bytes of a packed array's header and alignment, about
_INT32 = np.iinfo(np.int32)
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclasses.dataclass
class Spans:
    """Where each row's tokens are: the last plen[i] of P prompt columns, the first rlen[i] of T."""

    P: int
    T: int
    plen: np.ndarray  # (N,) int64
    rlen: np.ndarray

    @functools.cached_property
    def prompt(self) -> np.ndarray:
        return np.arange(self.P) >= (self.P - self.plen)[:, None]

    @functools.cached_property
    def response(self) -> np.ndarray:
        return np.arange(self.T) < self.rlen[:, None]

    @functools.cached_property
    def sequence(self) -> np.ndarray:
        return np.concatenate([self.prompt, self.response], 1)

    @functools.cached_property
    def positions(self) -> np.ndarray:
        """verl's position_ids, (cumsum(attention_mask) - 1).clamp(min=0), from the lengths alone."""
        # int32 and in place: a third of the time of the int64 expression (widths stay below 2^31)
        at = np.arange(self.P + self.T, dtype=np.int32)[None] - (self.P - self.plen).astype(np.int32)[:, None]
        np.maximum(at, 0, out=at)
        return np.minimum(at, np.maximum(self.plen + self.rlen - 1, 0).astype(np.int32)[:, None], out=at)


def _bits(t: torch.Tensor) -> np.ndarray:
    """t on the CPU as numpy, floats and bools as their bits: comparisons are exact (-0.0 is not 0, NaN
    equals itself) and bfloat16, which numpy lacks, reads like the rest."""
    t = t.detach().cpu()
    if t.dtype.is_floating_point or t.dtype == torch.bool:
        t = t.view(_BITS[t.element_size()])
    return t.numpy()


def _one(dtype: torch.dtype) -> int:
    """The bits of 1 in dtype."""
    return int(_bits(torch.ones(1, dtype=dtype))[0])


def _tensor(bits: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    if bits.ndim and bits.strides[-1] != bits.itemsize:  # a column view (one row's is "contiguous" to numpy)
        bits = bits.copy()
    t = torch.from_numpy(bits)
    return t.view(dtype) if dtype.is_floating_point or dtype == torch.bool else t.to(dtype)


# ---- writing ----


def pack(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], pb.Packing | None, dict]:
    """(the tensors still sent plain, the Packing or None, its arrays by name)."""
    spans = _spans(tensors)
    tokens = _tokens(tensors, spans) if spans is not None else None
    if spans is None or tokens is None:
        return tensors, None, {}
    prompt_part, responses, pad, layout = tokens
    packing = pb.Packing(prompt_width=spans.P, response_width=spans.T, pad=pad)
    for name in layout:
        packing.layout[name] = wire_dtype(tensors[name].dtype, name)
    arrays = {
        "prompt_lengths": torch.from_numpy(spans.plen.astype(np.int32)),
        "response_lengths": torch.from_numpy(spans.rlen.astype(np.int32)),
        "response_tokens": torch.from_numpy(responses[spans.response].astype(np.int32)),
    }
    if prompt_part is not None:
        arrays |= _distinct_prompts(prompt_part, spans)
    plain = {}
    for name, t in tensors.items():
        if name in layout:
            continue
        values = _ragged(name, t, spans)
        if values is None:
            plain[name] = t
            continue
        stored, per_row = values
        packing.ragged.add(name=name, dtype=wire_dtype(t.dtype, name), per_row=per_row)
        arrays[name] = stored
    replaced = sum(t.numel() * t.element_size() for k, t in tensors.items() if k not in plain)
    if replaced <= sum(a.numel() * a.element_size() + ARRAY_OVERHEAD for a in arrays.values()):
        return tensors, None, {}  # a few short rows: the arrays' headers and alignment cost more
    return plain, packing, arrays


def _spans(tensors: dict[str, torch.Tensor]) -> Spans | None:
    """The spans, if attention_mask is one contiguous run of ones per row over prompts | responses."""
    mask, responses = tensors.get("attention_mask"), tensors.get("responses")
    if mask is None or responses is None or mask.dim() != 2 or responses.dim() != 2 or mask.is_complex():
        return None
    if mask.shape[0] != responses.shape[0] or mask.shape[1] < responses.shape[1]:
        return None
    m = _bits(mask)
    P, T = mask.shape[1] - responses.shape[1], responses.shape[1]
    on = m != 0
    spans = Spans(P, T, on[:, :P].sum(1, dtype=np.int64), on[:, P:].sum(1, dtype=np.int64))
    if not np.array_equal(on, spans.sequence) or not np.array_equal(m == _one(mask.dtype), on):
        return None
    return spans


def _tokens(tensors: dict[str, torch.Tensor], spans: Spans):
    """(the prompt columns' ids or None, the responses, the pad id, the layout tensors to rebuild), if the
    layout tensors fit the rules; else None."""
    N, P, T = len(spans.plen), spans.P, spans.T
    if tensors["responses"].dtype not in (torch.int64, torch.int32):
        return None
    responses, prompt_part = _bits(tensors["responses"]), None
    for name, cols in (("input_ids", slice(None)), ("prompts", slice(0, P))):
        if name not in tensors:
            continue
        t = tensors[name]
        if t.dtype not in (torch.int64, torch.int32) or t.dim() != 2 or t.shape[0] != N:
            return None
        ids = _bits(t)
        if ids.shape[1] != (P + T if name == "input_ids" else P):
            return None
        if name == "input_ids" and not np.array_equal(ids[:, P:], responses):
            return None
        if prompt_part is not None and not np.array_equal(ids[:, cols], prompt_part):
            return None
        prompt_part = ids[:, :P]
    pad = _pad(responses, prompt_part, spans)
    if pad is None:
        return None
    if "position_ids" in tensors:
        pos = tensors["position_ids"]
        if pos.is_floating_point() or pos.shape != (N, P + T) or not np.array_equal(_bits(pos), spans.positions):
            return None
    return prompt_part, responses, pad, [k for k in LAYOUT if k in tensors]


def _pad(responses: np.ndarray, prompt_part: np.ndarray | None, spans: Spans) -> int | None:
    """The one id in every padded position (0 where nothing is padded), if ids and pad fit int32."""
    pairs = [(responses, spans.response)] + ([] if prompt_part is None else [(prompt_part, spans.prompt)])
    pad = None
    for ids, real in pairs:
        if ids.size and (ids.min() < _INT32.min or ids.max() > _INT32.max):
            return None
        first = int(np.argmin(real.reshape(-1))) if real.size else 0  # the first padded position, if any
        if pad is None and real.size and not real.reshape(-1)[first]:
            pad = int(ids.reshape(-1)[first])
    pad = 0 if pad is None else pad
    for ids, real in pairs:
        if not bool(np.all((ids == pad) | real)):
            return None
    return pad


def _distinct_prompts(prompt_part: np.ndarray, spans: Spans) -> dict[str, torch.Tensor]:
    """Each run of equal prompts once (a group's samples sit side by side) and each row's index into them."""
    new = np.ones(len(spans.plen), dtype=bool)
    if len(new) > 1:
        same = (prompt_part[1:] == prompt_part[:-1]).all(1) & (spans.plen[1:] == spans.plen[:-1])
        new[1:] = ~same
    return {
        "prompt_rows": torch.from_numpy((np.cumsum(new) - 1).astype(np.int32)),
        "prompt_tokens": torch.from_numpy(prompt_part[new][spans.prompt[new]].astype(np.int32)),
    }


def _ragged(name: str, t: torch.Tensor, spans: Spans) -> tuple[torch.Tensor, bool] | None:
    """(stored values, per_row) for an (N, T) tensor that is 0 past every response, else None."""
    if name in ARRAYS or t.dim() != 2 or t.shape != (len(spans.rlen), spans.T) or t.is_complex():
        return None
    b, response = _bits(t), spans.response
    firsts = b[:, 0] if spans.T else np.zeros(len(b), dtype=b.dtype)
    long = spans.rlen >= 2  # a cheap look at the second column before the full comparison
    alike = spans.T < 2 or bool(np.all(b[long, 1] == firsts[long]))
    if alike and bool(np.all((b == firsts[:, None]) | ~response)):
        stored, per_row = firsts, True
        inside = int(spans.rlen[(_tensor(firsts, t.dtype) != 0).numpy()].sum())
    else:
        stored, per_row = b[response], False
        inside = int(torch.count_nonzero(_tensor(stored, t.dtype)))
    if int(torch.count_nonzero(t.detach().cpu())) != inside:
        return None  # something past a response (-0.0 counts as 0: a masked product leaves it there)
    one = _one(t.dtype)
    if t.dtype != torch.bool and bool(np.all((stored == 0) | (stored == one))):
        return torch.from_numpy((stored != 0).astype(np.uint8)), per_row
    return _tensor(stored, t.dtype), per_row


# ---- reading ----


def unpack(packing: pb.Packing, arrays: dict[str, torch.Tensor], rows: int, received: int) -> dict[str, torch.Tensor]:
    """The tensors `packing` describes, rebuilt; ValueError naming what is wrong."""
    P, T = packing.prompt_width, packing.response_width
    if P < 0 or T < 0 or P + T > _INT32.max:
        raise ValueError(f"packing: widths out of range (prompt_width {P}, response_width {T})")
    names = list(packing.layout) + [r.name for r in packing.ragged]
    if len(set(names)) != len(names):
        raise ValueError(f"packing: a tensor named twice in {names}")
    unknown = set(packing.layout) - set(LAYOUT)
    if unknown:
        raise ValueError(f"packing: {sorted(unknown)} are not layout tensors (those are {list(LAYOUT)})")
    if not _INT32.min <= packing.pad <= _INT32.max:
        raise ValueError(f"packing: pad {packing.pad} is not an int32")
    rebuilt = rows * ((P + T) * 8 * (len(packing.layout) + 1) + T * 8 * len(packing.ragged))
    if rebuilt > REBUILT_FLOOR + REBUILT_PER_BYTE * received:
        raise ValueError(
            f"packing: {rows} rows of prompt_width {P} and response_width {T} would rebuild {rebuilt} bytes "
            f"from {received} received, past this reader's limit"
        )
    spans = Spans(P, T, _lengths(arrays, "prompt_lengths", rows, P), _lengths(arrays, "response_lengths", rows, T))
    out = _layout(packing, arrays, spans) if packing.layout else {}
    for r in packing.ragged:
        out[r.name] = _unragged(r, arrays, spans)
    return out


def _array(arrays: dict[str, torch.Tensor], name: str, size: int | None = None) -> torch.Tensor:
    a = arrays.get(name)
    if a is None:
        raise ValueError(f"packing: the packed array {name!r} is missing")
    if a.dim() != 1 or (size is not None and a.numel() != size):
        want = f"({size},)" if size is not None else "1-d"
        raise ValueError(f"packing: packed array {name!r} has shape {list(a.shape)}, expected {want}")
    return a


def _ints(arrays: dict[str, torch.Tensor], name: str, size: int | None = None) -> np.ndarray:
    a = _array(arrays, name, size)
    if a.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"packing: packed array {name!r} is {a.dtype}, expected int32")
    return a.numpy().astype(np.int64)


def _lengths(arrays: dict[str, torch.Tensor], name: str, rows: int, width: int) -> np.ndarray:
    a = _ints(arrays, name, rows)
    if a.size and (a.min() < 0 or a.max() > width):
        raise ValueError(f"packing: {name} must lie in [0, {width}]")
    return a


def _fill(shape: tuple[int, int], fill, real: np.ndarray, values: np.ndarray, name: str) -> np.ndarray:
    """A shape array of fill with values written where real is true, row by row."""
    count = int(np.count_nonzero(real))
    if values.size != count:
        raise ValueError(f"packing: {name} holds {values.size} values, the lengths say {count}")
    out = np.full(shape, fill, dtype=values.dtype)
    out[real] = values
    return out


def _layout(packing: pb.Packing, arrays: dict, spans: Spans) -> dict[str, torch.Tensor]:
    N, T = len(spans.plen), spans.T
    parts = {
        "responses": _fill((N, T), packing.pad, spans.response, _ints(arrays, "response_tokens"), "response_tokens")
    }
    if "prompts" in packing.layout or "input_ids" in packing.layout:
        parts["prompts"] = _prompts(packing, arrays, spans)
        parts["input_ids"] = np.concatenate([parts["prompts"], parts["responses"]], 1)
    parts["attention_mask"] = spans.sequence
    if "position_ids" in packing.layout:
        parts["position_ids"] = spans.positions
    return {name: torch.from_numpy(parts[name]).to(torch_dtype(d, name)) for name, d in packing.layout.items()}


def _prompts(packing: pb.Packing, arrays: dict, spans: Spans) -> np.ndarray:
    """The distinct prompts rebuilt, then one per row by prompt_rows (0, then steps of 0 or 1)."""
    N = len(spans.plen)
    index = _ints(arrays, "prompt_rows", N)
    steps = np.diff(index)
    if N and (index[0] != 0 or not bool(np.all((steps == 0) | (steps == 1)))):
        raise ValueError("packing: prompt_rows must start at 0 and rise by 0 or 1 from row to row")
    firsts = np.ones(N, dtype=bool)
    firsts[1:] = steps != 0
    lengths = spans.plen[firsts]
    if not np.array_equal(lengths[index], spans.plen):
        raise ValueError("packing: rows that share a prompt (prompt_rows) differ in prompt_lengths")
    distinct = Spans(spans.P, 0, lengths, lengths[:0])
    tokens = _ints(arrays, "prompt_tokens")
    return _fill((len(lengths), spans.P), packing.pad, distinct.prompt, tokens, "prompt_tokens")[index]


def _unragged(r: pb.Ragged, arrays: dict, spans: Spans) -> torch.Tensor:
    if r.name in ARRAYS or r.name in LAYOUT:
        raise ValueError(f"packing: {r.name!r} cannot be a ragged tensor")
    dtype = torch_dtype(r.dtype, r.name)
    real = spans.response
    values = _array(arrays, r.name, len(spans.rlen) if r.per_row else int(np.count_nonzero(real)))
    if values.dtype != dtype and values.dtype != torch.uint8:
        raise ValueError(f"packing: ragged {r.name!r} holds {values.dtype}, expected {dtype} or uint8")
    bits = _bits(values.to(dtype))
    if r.per_row:
        bits = np.repeat(bits, spans.rlen)
    return _tensor(_fill(real.shape, 0, real, bits, r.name), dtype)
