"""Delta pushes' encoding (meshrl/delta.py) and the rollout's base (services/rollout/base.py), without
services: how each tensor travels, bit-exact changes (-0.0 and NaN count), and a base rebuilt from the parts
alone equal to the sender's, its checksums checked."""

import math

import pytest
import torch

from meshrl import weights
from meshrl.delta import SAME, SPARSE, WHOLE, Base, checksum, payload_nbytes
from meshrl.errors import DataLoss, InvalidArgument
from services.rollout.base import Base as RolloutBase


def refs_of(named: dict) -> list:
    (bucket,) = weights.plan([(k, t.dtype, list(t.shape)) for k, t in named.items()], 1 << 30)
    return bucket.refs


def wire(payload) -> bytearray:
    """The bucket's bytes as the rollout would hold them in its staging segment."""
    buf = bytearray(max(payload.size, 64))
    for part in payload.parts:
        raw = part.tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
        buf[part.offset : part.offset + len(raw)] = raw
    return buf


def reader(buf: bytearray):
    return lambda dtype, shape, offset: torch.frombuffer(buf, dtype=dtype, count=math.prod(shape), offset=offset).view(
        shape
    )


@pytest.fixture
def named() -> dict:
    g = torch.Generator().manual_seed(0)
    return {
        "a.weight": torch.randn(64, 32, generator=g).to(torch.bfloat16),
        "b.weight": torch.randn(300, generator=g).to(torch.bfloat16),
        "c.weight": torch.randn(16, 16, generator=g).to(torch.bfloat16),
    }


def test_each_tensor_travels_the_smallest_way_and_bit_changes_count(named):
    base, refs = Base(), refs_of(named)
    named["a.weight"].view(-1)[3] = 0.0  # +0.0, then -0.0: equal as floats, another value in bf16 bits
    first = base.encode(refs, list(named.values()), delta=True)  # no base yet: whole
    assert [r.delta for r in first.refs] == [WHOLE] * 3
    assert [r.checksum for r in first.refs] == [checksum(t) for t in named.values()]

    new = {k: v.clone() for k, v in named.items()}
    new["a.weight"].view(-1)[[3, 70]] = torch.tensor([-0.0, float("nan")], dtype=torch.bfloat16)
    new["a.weight"].view(-1)[5] = 0.0
    new["c.weight"] += 1.0  # every value: whole is smaller
    out = base.encode(refs, list(new.values()), delta=True)
    a, b, c = out.refs
    assert (a.delta, a.count) == (SPARSE, 3) and b.delta == SAME and c.delta == WHOLE
    values, index = (p.tensor for p in out.parts[:2])
    assert index.dtype == torch.int32 and index.tolist() == [3, 5, 70]
    assert torch.equal(values.view(torch.int16), new["a.weight"].view(-1)[[3, 5, 70]].view(torch.int16))
    assert out.num_bytes == sum(payload_nbytes(r, 2) for r in out.refs) == 3 * (2 + 4) + 16 * 16 * 2
    assert all(torch.equal(base.tensors[k].view(torch.int16), new[k].view(torch.int16)) for k in new)


def test_a_rollout_base_rebuilt_from_the_parts_equals_the_senders_and_checks_them(named):
    sender, receiver, refs = Base(), RolloutBase(), refs_of(named)
    receiver.start(sum(t.numel() * 2 + 64 for t in named.values()))
    try:
        history = [named]
        for step in range(3):
            prev = history[-1]
            g = torch.Generator().manual_seed(step)
            history.append(
                {k: (v.float() + 0.05 * (torch.rand(v.shape, generator=g) < 0.1)).to(v.dtype) for k, v in prev.items()}
            )
        for i, state in enumerate(history):
            payload = sender.encode(refs, list(state.values()), delta=i > 0)
            loads = receiver.take(payload.refs, reader(wire(payload)))
            for name, dtype, shape, offset in loads:
                held = receiver.segment.tensor(getattr(torch, dtype), shape, offset)
                assert torch.equal(held.view(torch.int16), state[name].view(torch.int16)), (i, name)
        stale = sender.encode(refs, [t + 1 for t in history[-1].values()], delta=True)
        stale.refs[0].checksum ^= 1  # what the sender says the result is no longer matches
        with pytest.raises(DataLoss, match="a.weight"):
            receiver.take(stale.refs, reader(wire(stale)))
        few = [sender.tensors[r.name].clone() for r in refs]
        few[0].view(-1)[7] += 1  # one element: sparse
        bad = sender.encode(refs, few, delta=True)
        sparse = next(r for r in bad.refs if r.delta == SPARSE)
        buf = wire(bad)
        buf[sparse.index_offset : sparse.index_offset + 4] = (10**6).to_bytes(4, "little")
        with pytest.raises(InvalidArgument, match="outside its"):
            receiver.take([sparse], reader(buf))
    finally:
        receiver.drop()
