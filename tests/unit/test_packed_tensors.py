"""Packed tensors on the wire (meshrl/codec/packing.py): a batch in verl's layout travels unpadded and
comes back exactly; anything off the rules travels plain; a bad packed message is refused by name."""

import random

import numpy as np
import pytest
import torch
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from meshrl.codec import (
    Assembler,
    Payload,
    decode_dataproto,
    decode_message,
    encode_dataproto,
    encode_message,
    split_rows,
)
from meshrl.dataproto import DataProto
from meshrl.layout import rollout_tensors
from meshrl.v1 import data_pb2 as pb
from meshrl.v1 import reward_pb2


def rollout_batch(
    groups: int, n: int, max_prompt: int, max_response: int, *, seed: int = 0, multi_turn: bool = False, pad: int = 0
) -> DataProto:
    """A rollout's batch as the rollout service returns it, with a step's advantages beside it."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(1, 500) for _ in range(rng.randint(0, max_prompt))] for _ in range(groups)]
    rows = groups * n
    responses = [[rng.randrange(1, 500) for _ in range(rng.randint(0, max_response))] for _ in range(rows)]
    masks = [[rng.randint(0, 1) for _ in r] for r in responses] if multi_turn else None
    logprobs = [[-rng.random() for _ in r] for r in responses]
    t = rollout_tensors([prompts[i // n] for i in range(rows)], responses, pad, masks, logprobs)
    t["advantages"] = torch.randn(rows, 1) * t["response_mask"]  # -0.0 past each response, as a step makes them
    return DataProto(t, {"uid": np.array([f"g{i // n}" for i in range(rows)], dtype=object)})


def assert_exact(a: DataProto, b: DataProto) -> None:
    assert list(a.batch) == list(b.batch) or set(a.batch) == set(b.batch)
    for k, t in a.batch.items():
        u = b.batch[k]
        assert u.dtype == t.dtype and u.shape == t.shape, k
        assert torch.equal(u, t), k  # -0.0 == 0.0 past a response; inside, values bit for bit (below)
    assert a.non_tensor_batch.keys() == b.non_tensor_batch.keys()


def roundtrip(data: DataProto) -> tuple[DataProto, pb.DataProto]:
    buf = b"".join(encode_dataproto(data))
    return decode_dataproto(buf)[0], pb.DataProto.FromString(buf)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 5),
    st.integers(1, 4),
    st.integers(0, 12),
    st.integers(0, 12),
    st.integers(0, 2**16),
    st.booleans(),
    st.sampled_from([0, 1, 151643]),
)
def test_a_rollout_batch_comes_back_exactly(groups, n, max_prompt, max_response, seed, multi_turn, pad):
    data = rollout_batch(groups, n, max_prompt, max_response, seed=seed, multi_turn=multi_turn, pad=pad)
    back, msg = roundtrip(data)
    assert_exact(data, back)
    if msg.HasField("packing"):
        assert not {t.name for t in msg.tensors} & {"input_ids", "attention_mask", "position_ids", "responses"}


def test_the_layout_travels_once_unpadded_as_int32():
    data = rollout_batch(8, 4, 40, 60, seed=1)
    back, msg = roundtrip(data)
    assert_exact(data, back)
    assert [t.name for t in msg.tensors] == []  # everything packed
    arrays = {t.name: t for t in msg.packed}
    assert arrays["prompt_tokens"].dtype == pb.INT32 and arrays["response_tokens"].dtype == pb.INT32
    # each group's prompt once; each response's tokens once, without padding
    P = data.batch["prompts"].shape[1]
    assert arrays["prompt_tokens"].shape[0] == int(data.batch["attention_mask"][::4, :P].sum())
    assert arrays["response_tokens"].shape[0] == int(data.batch["response_mask"].sum())
    assert set(msg.packing.layout) == {"prompts", "responses", "input_ids", "attention_mask", "position_ids"}
    ragged = {r.name: r.per_row for r in msg.packing.ragged}
    # GRPO's advantages and an all-ones mask: one value per row; the log-probs: each token's value
    assert ragged == {"response_mask": True, "advantages": True, "rollout_logprobs": False}
    assert arrays["response_mask"].dtype == pb.UINT8
    plain = sum(t.numel() * t.element_size() for t in data.batch.values())
    assert plain > 6 * msg.ByteSize()


def test_values_inside_a_response_keep_their_bits():
    data = rollout_batch(8, 4, 20, 30, seed=2)
    lp = data.batch["rollout_logprobs"]
    a, b = torch.nonzero(data.batch["response_mask"][:, 0])[:2, 0].tolist()
    lp[a, 0], lp[b, 0] = float("nan"), -0.0
    data.batch["halves"] = lp.bfloat16()
    back, msg = roundtrip(data)
    assert msg.HasField("packing") and "rollout_logprobs" in {r.name for r in msg.packing.ragged}
    for k, bits in (("rollout_logprobs", torch.int32), ("halves", torch.int16)):
        assert torch.equal(data.batch[k].view(bits), back.batch[k].view(bits)), k


@pytest.mark.parametrize(
    "spoil",
    [
        "a hole in the mask",
        "input_ids not the join",
        "two pad ids",
        "positions of another rule",
        "an id past int32",
        "float token ids",
    ],
)
def test_a_batch_off_the_rules_travels_plain_and_unchanged(spoil):
    data = rollout_batch(3, 2, 6, 8, seed=3)
    t = data.batch
    P = t["prompts"].shape[1]
    row = int(torch.nonzero(t["response_mask"].sum(1) >= 3)[0])
    if spoil == "a hole in the mask":
        t["attention_mask"][row, P + 1] = 0
    elif spoil == "input_ids not the join":
        t["input_ids"][row, P] += 1
    elif spoil == "two pad ids":
        short = int(torch.nonzero(t["response_mask"].sum(1) < t["responses"].shape[1])[0])
        t["responses"][short, -1] = t["input_ids"][short, -1] = 7
    elif spoil == "positions of another rule":
        t["position_ids"] = torch.arange(t["input_ids"].shape[1]).expand_as(t["input_ids"]).clone()
    elif spoil == "an id past int32":
        t["responses"][row, 0] = t["input_ids"][row, P] = 2**40
    elif spoil == "float token ids":
        t["responses"], t["input_ids"], t["prompts"] = (
            t["responses"].float(),
            t["input_ids"].float(),
            t["prompts"].float(),
        )
    back, msg = roundtrip(data)
    assert_exact(data, back)
    layout = {"input_ids", "attention_mask", "position_ids", "responses"}
    assert layout <= {x.name for x in msg.tensors}, "the layout should have travelled plain"


def test_one_long_row_comes_back_exactly():
    """A multi-turn episode is one row: its per-row values are one element of a column, which must still
    travel as bytes (a strided one-element tensor)."""
    data = rollout_batch(1, 1, 20, 200, seed=9, multi_turn=True)
    data.batch["response_mask"][0, :] = (data.batch["response_mask"][0] > 0).float()
    back = decode_message(reward_pb2.ScoreRequest, encode_message(reward_pb2.ScoreRequest(), data))[0].data
    assert back is not None
    assert_exact(data, back)
    column = torch.randn(1, 23)[:, 0]  # shape (1,), stride (23,)
    assert torch.equal(decode_dataproto(b"".join(encode_dataproto(DataProto({"x": column}))))[0].batch["x"], column)


def test_a_tensor_with_values_past_the_responses_travels_plain():
    data = rollout_batch(3, 2, 6, 8, seed=4)
    data.batch["values"] = torch.randn(data.batch["responses"].shape)  # nothing masked: not response-aligned
    back, msg = roundtrip(data)
    assert_exact(data, back)
    assert "values" in {t.name for t in msg.tensors} and msg.HasField("packing")


def test_a_few_short_rows_travel_plain():
    data = rollout_batch(1, 1, 1, 1, seed=5)
    back, msg = roundtrip(data)
    assert_exact(data, back)
    assert not msg.HasField("packing")


def test_a_streamed_batch_is_packed_part_by_part():
    data = rollout_batch(64, 8, 30, 200, seed=6)
    payload = Payload(reward_pb2.ScoreRequest(), data)
    parts = list(split_rows(payload, chunk_bytes=64 << 10))
    assert len(parts) > 3
    collect = Assembler(reward_pb2.ScoreRequest)
    for p in parts:
        assert decode_message(reward_pb2.ScoreRequest, p)[0].data is not None
        collect.add(p)
    assert_exact(data, collect.result().data)
    plain = list(split_rows(Payload(reward_pb2.ScoreRequest(), data, packed=False), chunk_bytes=64 << 10))
    assert sum(map(len, parts)) * 4 < sum(map(len, plain))
    # a part is about chunk_bytes on the wire packed, as it is plain
    assert max(map(len, parts)) < 3 * (64 << 10)


def test_a_reader_of_plain_tensors_finds_packed_ones_missing_not_misread():
    data = rollout_batch(8, 4, 40, 60, seed=7)
    msg = pb.DataProto.FromString(b"".join(encode_dataproto(data)))
    assert all(t.name not in data.batch for t in msg.tensors)
    plain = pb.DataProto.FromString(b"".join(encode_dataproto(data, packed=False)))
    assert not plain.HasField("packing") and {t.name for t in plain.tensors} == set(data.batch)


def packed_message(seed: int = 8) -> pb.DataProto:
    return pb.DataProto.FromString(b"".join(encode_dataproto(rollout_batch(8, 4, 40, 60, seed=seed))))


def array(msg: pb.DataProto, name: str) -> pb.Tensor:
    return next(t for t in msg.packed if t.name == name)


def set_ints(t: pb.Tensor, values) -> None:
    a = np.asarray(values, dtype=np.int32)
    t.data, t.shape[:] = a.tobytes(), [len(a)]


def spoil_widths(m):
    m.packing.prompt_width = 1 << 30


def spoil_negative_width(m):
    m.packing.response_width = -1


def spoil_lengths(m):
    a = array(m, "response_lengths")
    lengths = np.frombuffer(a.data, dtype=np.int32).copy()
    lengths[0] = m.packing.response_width + 1
    set_ints(a, lengths)


def spoil_token_count(m):
    a = array(m, "response_tokens")
    set_ints(a, np.frombuffer(a.data, dtype=np.int32)[:-1])


def spoil_prompt_rows(m):
    a = array(m, "prompt_rows")
    rows = np.frombuffer(a.data, dtype=np.int32).copy()
    rows[-1] += 5
    set_ints(a, rows)


def spoil_missing_array(m):
    del m.packed[[t.name for t in m.packed].index("prompt_tokens")]


def spoil_layout_name(m):
    m.packing.layout["labels"] = pb.INT64


def spoil_ragged_dtype(m):
    array(m, "rollout_logprobs").dtype = pb.INT32


def spoil_arrays_without_packing(m):
    m.ClearField("packing")


def spoil_pad(m):
    m.packing.pad = 1 << 40


def spoil_both(m):
    m.tensors.add(name="responses", dtype=pb.INT64, shape=[m.num_rows, 0])


@pytest.mark.parametrize(
    "spoil, match",
    [
        (spoil_widths, "past this reader's limit"),
        (spoil_negative_width, "widths out of range"),
        (spoil_lengths, "response_lengths must lie in"),
        (spoil_token_count, "response_tokens holds"),
        (spoil_prompt_rows, "prompt_rows must start at 0"),
        (spoil_missing_array, "'prompt_tokens' is missing"),
        (spoil_layout_name, "not layout tensors"),
        (spoil_ragged_dtype, "ragged 'rollout_logprobs' holds"),
        (spoil_arrays_without_packing, "without a `packing`"),
        (spoil_pad, "is not an int32"),
        (spoil_both, "appears twice"),
    ],
)
def test_a_bad_packed_message_is_refused_by_name(spoil, match):
    msg = packed_message()
    spoil(msg)
    with pytest.raises(ValueError, match=match):
        decode_dataproto(msg.SerializeToString())


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 8))
def test_any_corruption_of_a_packed_message_is_a_value_error(seed, flips):
    """A reader survives any bytes: it decodes them or raises ValueError or DecodeError, nothing else."""
    buf = bytearray(packed_message(seed % 4).SerializeToString())
    rng = random.Random(seed)
    for _ in range(flips):
        buf[rng.randrange(len(buf))] = rng.randrange(256)
    try:
        decode_dataproto(bytes(buf))
    except (ValueError, DecodeError):  # both are INVALID_ARGUMENT (meshrl/errors.py)
        pass
