"""How a weight push is cut into buckets (meshrl.weights.plan) and how a bucket is streamed."""

import pytest
import torch

from meshrl import weights
from meshrl.delta import whole

F32 = torch.float32


def specs(layers=3, width=16):
    out = [("model.embed_tokens.weight", F32, [100, width])]
    for i in range(layers):
        out += [
            (f"model.layers.{i}.self_attn.q_proj.weight", F32, [width, width]),
            (f"model.layers.{i}.self_attn.k_proj.weight", F32, [width // 2, width]),
            (f"model.layers.{i}.mlp.up_proj.weight", F32, [2 * width, width]),
            (f"model.layers.{i}.input_layernorm.weight", F32, [width]),
        ]
    return out + [("model.norm.weight", F32, [width]), ("lm_head.weight", F32, [100, width])]


def test_buckets_keep_blocks_whole_and_within_the_bound():
    block = 4 * (16 * 16 + 8 * 16 + 32 * 16 + 16)  # one layer's bytes, all 64-aligned already
    buckets = weights.plan(specs(), bucket_bytes=2 * block)
    names = [[r.name for r in b.refs] for b in buckets]
    assert [n for b in names for n in b] == [s[0] for s in specs()]  # everything once, in order
    for b in buckets:
        assert b.size <= 2 * block or len({weights.block_of(r.name) for r in b.refs}) == 1
        layers = {weights.block_of(r.name) for r in b.refs}
        for layer in layers:  # a block is never split between buckets
            assert all(
                weights.block_of(n) != layer
                for other in buckets
                if other is not b
                for n in (r.name for r in other.refs)
            )
        ends = [r.offset + weights.ref_nbytes(r) for r in b.refs]
        assert all(r.offset % weights.ALIGN == 0 for r in b.refs) and max(ends) <= b.size
        assert all(b.refs[i].offset >= ends[i - 1] for i in range(1, len(b.refs)))  # no overlaps
    assert len(buckets) > 2


def test_a_block_larger_than_the_bucket_travels_alone():
    buckets = weights.plan(specs(layers=2, width=64), bucket_bytes=1024)
    layer0 = [b for b in buckets if any(r.name.startswith("model.layers.0.") for r in b.refs)]
    assert len(layer0) == 1 and all(r.name.startswith("model.layers.0.") for r in layer0[0].refs)
    assert layer0[0].size > 1024


def test_one_bucket_when_it_fits_and_a_bad_size_is_refused():
    (whole,) = weights.plan(specs(), bucket_bytes=1 << 30)
    refs, size = weights.layout({n: torch.zeros(s, dtype=d) for n, d, s in specs()})
    assert size == whole.size and [r.name for r in refs] == [r.name for r in whole.refs]
    with pytest.raises(ValueError, match="bucket_bytes must be >= 64"):
        weights.plan(specs(), bucket_bytes=8)


def test_block_of():
    assert weights.block_of("model.layers.12.self_attn.q_proj.weight") == "model.layers.12"
    assert weights.block_of("model.layers.3.mlp.experts.7.w1.weight") == "model.layers.3"
    assert weights.block_of("model.embed_tokens.weight") == "model.embed_tokens"
    assert weights.block_of("lm_head.weight") == "lm_head"


def test_stream_chunks_cover_a_bucket_without_its_padding():
    named = {"a": torch.arange(10, dtype=F32), "b": torch.arange(7, dtype=torch.bfloat16), "c": torch.ones(3, 5)}
    (bucket,) = weights.plan([(k, t.dtype, list(t.shape)) for k, t in named.items()])
    flat = bytearray(bucket.size)
    for offset, pieces in weights.stream_chunks(whole(bucket.refs, bucket.size, list(named.values())), chunk=16):
        for p in pieces:
            flat[offset : offset + len(p)] = p
            offset += len(p)
    for t, r in zip(named.values(), bucket.refs):
        got = torch.frombuffer(flat, dtype=t.dtype, count=t.numel(), offset=r.offset).view(t.shape)
        assert torch.equal(got, t)
