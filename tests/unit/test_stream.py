"""Row streams: a large batch split into ~chunk-sized messages and put back together."""

import pytest
import torch

from meshrl.codec import Assembler, Payload, decode_message, split_rows
from meshrl.dataproto import DataProto
from meshrl.v1 import rollout_pb2

MSG = rollout_pb2.GenerateRequest(sampling=rollout_pb2.SamplingParams(n=4, temperature=0.7))


def big(rows=1000):
    return DataProto(
        {"ids": torch.arange(rows * 64).view(rows, 64), "lp": torch.randn(rows, 64).bfloat16()},
        {"src": [f"row{i}" for i in range(rows)]},
        {"eos_token_id": 2},
    )


def assemble(parts) -> Payload:
    asm = Assembler(rollout_pb2.GenerateRequest)
    for p in parts:
        asm.add(p)
    return asm.result()


def test_split_into_chunks_and_reassemble():
    data = big()
    parts = list(split_rows(Payload(MSG, data), chunk_bytes=64 << 10))
    assert len(parts) > 5
    assert max(len(p) for p in parts) < 80 << 10
    first, offset, total = decode_message(rollout_pb2.GenerateRequest, parts[0])
    assert (offset, total) == (0, 1000) and first.msg == MSG and first.data.meta_info == {"eos_token_id": 2}
    later = decode_message(rollout_pb2.GenerateRequest, parts[1])[0]
    assert later.msg == rollout_pb2.GenerateRequest() and later.data.meta_info == {}  # sent once
    back = assemble(parts)
    assert back.msg == MSG
    assert torch.equal(back.data.batch["ids"], data.batch["ids"])
    assert torch.equal(back.data.batch["lp"], data.batch["lp"])
    assert list(back.data.non_tensor_batch["src"]) == list(data.non_tensor_batch["src"])
    assert back.data.meta_info == {"eos_token_id": 2}


def test_small_payload_is_one_message():
    parts = list(split_rows(Payload(MSG, big(3))))
    assert len(parts) == 1
    assert assemble(parts).data.batch["ids"].shape == (3, 64)
    assert len(list(split_rows(Payload(MSG)))) == 1


def test_rows_larger_than_a_chunk_go_one_per_message():
    data = DataProto({"x": torch.randn(3, 1 << 16)})
    parts = list(split_rows(Payload(MSG, data), chunk_bytes=1 << 10))
    assert len(parts) == 3
    assert torch.equal(assemble(parts).data.batch["x"], data.batch["x"])


def chunks():
    return list(split_rows(Payload(MSG, big(100)), chunk_bytes=8 << 10))


def test_reordered_chunks_are_refused():
    parts = chunks()
    parts[1], parts[2] = parts[2], parts[1]
    with pytest.raises(ValueError, match="lost or reordered"):
        assemble(parts)


def test_stream_not_starting_at_row_zero_is_refused():
    with pytest.raises(ValueError, match="stream starts at row"):
        assemble(chunks()[1:])


def test_truncated_stream_is_refused():
    with pytest.raises(ValueError, match=r"stream ended after \d+ of 100 rows \(truncated\)"):
        assemble(chunks()[:-1])


def test_duplicated_chunk_is_refused():
    parts = chunks()
    with pytest.raises(ValueError, match="lost or reordered"):
        assemble([parts[0], parts[1], parts[1], *parts[2:]])


def test_part_after_the_end_is_refused():
    parts = chunks()
    with pytest.raises(ValueError, match="after the end of the stream"):
        assemble([*parts, parts[-1]])


def test_part_with_other_fields_is_refused():
    parts = chunks()
    asm = Assembler(rollout_pb2.GenerateRequest)
    asm.add(parts[0])
    p = decode_message(rollout_pb2.GenerateRequest, parts[1])
    from meshrl.codec import encode_message

    bad = encode_message(
        rollout_pb2.GenerateRequest(sampling=rollout_pb2.SamplingParams(n=9)),
        p[0].data,
        row_offset=p[1],
        total_rows=p[2],
    )
    with pytest.raises(ValueError, match="fields other than `data` differ"):
        asm.add(bad)


def test_part_with_different_tensor_shape_is_refused():
    from meshrl.codec import encode_message

    asm = Assembler(rollout_pb2.GenerateRequest)
    asm.add(encode_message(MSG, DataProto({"x": torch.zeros(2, 3)}), row_offset=0, total_rows=4))
    with pytest.raises(ValueError, match=r"tensor 'x': part at row 2"):
        asm.add(
            encode_message(
                rollout_pb2.GenerateRequest(), DataProto({"x": torch.zeros(2, 4)}), row_offset=2, total_rows=4
            )
        )


def test_empty_stream_is_refused():
    with pytest.raises(ValueError, match="empty stream"):
        assemble([])


def test_chunks_stay_bounded_when_later_rows_are_larger():
    texts = ["a"] * 500 + ["x" * 20000] * 500  # ~10 MB, all of it after the first rows
    data = DataProto(non_tensor_batch={"text": texts})
    parts = list(split_rows(Payload(MSG, data), chunk_bytes=1 << 20))
    assert len(parts) >= 10 and max(map(len, parts)) < 2 << 20
    assert list(assemble(parts).data.non_tensor_batch["text"]) == texts
