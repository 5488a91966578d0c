"""The wire codec: round trips over dtypes, shapes and values, zero-copy decode, every bad input."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from meshrl.codec import decode_dataproto, decode_message, encode_dataproto, encode_message, from_proto, to_proto
from meshrl.codec.dtypes import TO_TORCH
from meshrl.dataproto import DataProto
from meshrl.v1 import data_pb2 as pb
from meshrl.v1 import reward_pb2, rollout_pb2

DTYPES = list(TO_TORCH.values())

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=10,
)


def random_tensor(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Arbitrary bit patterns (NaNs, infinities, subnormals included); bools are 0 or 1."""
    rng = np.random.default_rng(seed)
    if dtype == torch.bool:
        return torch.from_numpy(rng.integers(0, 2, size=shape).astype(bool))
    itemsize = torch.empty((), dtype=dtype).element_size()
    raw = bytearray(rng.bytes(math.prod(shape) * itemsize))
    return (torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)).view(shape)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and bytes(a.contiguous().view(torch.uint8).numpy()) == bytes(b.contiguous().view(torch.uint8).numpy())
    )


def assert_same(a: DataProto, b: DataProto):
    assert list(a.batch) == list(b.batch)
    for k in a.batch:
        assert same_bits(a.batch[k], b.batch[k]), k
    assert set(a.non_tensor_batch) == set(b.non_tensor_batch)
    for k in a.non_tensor_batch:
        assert list(a.non_tensor_batch[k]) == list(b.non_tensor_batch[k]), k
    assert a.meta_info == b.meta_info


@st.composite
def dataprotos(draw, max_rows=5):
    n = draw(st.integers(0, max_rows))
    tensors = {}
    for i in range(draw(st.integers(0, 4))):
        dtype = draw(st.sampled_from(DTYPES))
        trailing = tuple(draw(st.lists(st.integers(0, 4), max_size=2)))
        tensors[f"t{i}"] = random_tensor(dtype, (n, *trailing), draw(st.integers(0, 2**32)))
    columns = {f"c{i}": draw(st.lists(json_values, min_size=n, max_size=n)) for i in range(draw(st.integers(0, 2)))}
    meta = draw(st.dictionaries(st.text(min_size=1, max_size=8), json_values, max_size=3))
    return DataProto(tensors, columns, meta)


@settings(max_examples=150, deadline=None)
@given(dataprotos())
def test_roundtrip_fast_path(data):
    back, offset, total = decode_dataproto(b"".join(encode_dataproto(data)))
    assert_same(data, back)
    assert (offset, total) == (0, 0)
    assert len(back) == len(data)


@settings(max_examples=60, deadline=None)
@given(dataprotos())
def test_fast_path_is_plain_protobuf(data):
    """What the fast writer emits, protobuf parses; what protobuf writes, the fast reader reads."""
    msg = pb.DataProto.FromString(b"".join(encode_dataproto(data)))
    assert [t.name for t in msg.tensors] == list(data.batch)
    for t in msg.tensors:
        assert t.data == bytes(data.batch[t.name].contiguous().view(torch.uint8).numpy())
        assert list(t.shape) == list(data.batch[t.name].shape)
    assert msg.num_rows == len(data)
    assert_same(data, from_proto(msg))
    assert_same(data, from_proto(to_proto(data)))


@settings(max_examples=60, deadline=None)
@given(dataprotos(), st.integers(0, 300), st.text(max_size=30))
def test_message_roundtrip_with_other_fields(data, max_new_tokens, stop):
    msg = rollout_pb2.GenerateRequest(sampling=rollout_pb2.SamplingParams(max_new_tokens=max_new_tokens, stop=[stop]))
    payload, _, _ = decode_message(rollout_pb2.GenerateRequest, encode_message(msg, data))
    assert payload.msg == msg
    assert_same(data, payload.data)


def test_decode_is_zero_copy_and_aligned():
    data = DataProto(
        {
            "x": torch.randn(64, 32),
            "ids": torch.arange(64),
            "h": torch.randn(64, 3).half(),
            "b": torch.randn(64, 5).bfloat16(),
        },
        {"s": ["a"] * 64},
    )
    buf = encode_message(reward_pb2.ScoreRequest(), data)
    start = np.frombuffer(buf, dtype=np.uint8).ctypes.data
    back = decode_message(reward_pb2.ScoreRequest, buf)[0].data
    for k, t in back.batch.items():
        assert start <= t.data_ptr() < start + len(buf), f"{k} was copied"
        assert t.data_ptr() % t.element_size() == 0
        assert torch.equal(t, data.batch[k])


def test_non_contiguous_and_strided_tensors_travel():
    x = torch.arange(24).view(4, 6)
    data = DataProto({"t": x.t().contiguous()[:, :4].t(), "s": x[:, ::2]})
    back = decode_dataproto(b"".join(encode_dataproto(data)))[0]
    assert torch.equal(back.batch["s"], x[:, ::2]) and torch.equal(back.batch["t"], data.batch["t"])


def test_ints_stay_ints_and_floats_stay_floats():
    data = DataProto(non_tensor_batch={"v": [3, 3.0, True, None, [1, 2.5], {"k": -1}]}, meta_info={"n": 1, "f": 1.0})
    back = decode_dataproto(b"".join(encode_dataproto(data)))[0]
    values = list(back.non_tensor_batch["v"])
    assert values == [3, 3.0, True, None, [1, 2.5], {"k": -1}]
    assert [type(v) for v in values[:3]] == [int, float, bool]
    assert type(back.meta_info["n"]) is int and type(back.meta_info["f"]) is float


def test_numpy_values_become_python_values():
    data = DataProto(non_tensor_batch={"v": np.array([1, 2], dtype=np.int64)}, meta_info={"a": np.float32(0.5)})
    back = decode_dataproto(b"".join(encode_dataproto(data)))[0]
    assert list(back.non_tensor_batch["v"]) == [1, 2] and back.meta_info["a"] == 0.5


# ---- bad input: each raises ValueError naming the field -------------------------------------------


def raw(tensors=(), num_rows=0, **kw) -> bytes:
    return pb.DataProto(tensors=list(tensors), num_rows=num_rows, **kw).SerializeToString()


def f32(name="x", shape=(2, 2), nbytes=16, **kw):
    return pb.Tensor(name=name, dtype=pb.FLOAT32, shape=list(shape), data=b"\0" * nbytes, **kw)


@pytest.mark.parametrize(
    "buf,match",
    [
        (raw([f32(nbytes=15)], 2), r"tensor 'x': 15 bytes of data do not match shape \[2, 2\] of float32 \(16 bytes\)"),
        (raw([f32(nbytes=17)], 2), r"tensor 'x': 17 bytes"),
        (raw([pb.Tensor(name="x", dtype=42, shape=[1], data=b"\0")], 1), r"tensor 'x': unknown dtype 42"),
        (raw([pb.Tensor(name="x", shape=[1], data=b"\0")], 1), r"tensor 'x': unknown dtype 0"),
        (raw([f32(), f32("y", (3, 2), 24)], 2), r"tensor 'y' has 3 rows but the batch has 2"),
        (raw([f32()], 3), r"tensor 'x' has 2 rows but the batch has 3"),
        (raw([f32(), f32()], 2), r"tensor 'x' appears twice"),
        (raw([f32(name="")], 2), r"tensor #0 has no name"),
        (raw([f32(shape=(), nbytes=4)], 1), r"tensor 'x': scalar"),
        (raw([f32(shape=(2, -2), nbytes=0)], 2), r"tensor 'x': negative dimension"),
        (raw([pb.Tensor(name="m", dtype=pb.BOOL, shape=[2], data=b"\x01\x07")], 2), r"tensor 'm': bool data"),
        (
            raw([], 2, non_tensors={"s": pb.Column(values=[pb.Value(string_value="a")])}),
            r"non_tensor 's' has 1 rows but the batch has 2",
        ),
        (
            raw([f32()], 2, non_tensors={"x": pb.Column(values=[pb.Value(int_value=1)] * 2)}),
            r"both tensors and non-tensors",
        ),
        (raw([], 1, non_tensors={"s": pb.Column(values=[pb.Value()])}), r"non_tensor 's' row 0: value has no kind"),
        (raw([f32()], 2)[:-3], r"truncated"),
        (b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", r"varint longer than 10 bytes"),
        (b"\x0b", r"wire type 3"),
    ],
)
def test_bad_input_names_the_problem(buf, match):
    with pytest.raises(ValueError, match=match):
        decode_dataproto(buf)


def test_unsendable_tensors_and_values_name_the_field():
    with pytest.raises(ValueError, match=r"tensor 'x': dtype torch.int16 cannot travel"):
        encode_dataproto(DataProto({"x": torch.zeros(2, dtype=torch.int16)}))
    with pytest.raises(ValueError, match=r"non_tensor 's' row 1: a set cannot travel"):
        encode_dataproto(DataProto(non_tensor_batch={"s": ["a", {1, 2}]}))
    with pytest.raises(ValueError, match=r"meta 'big': int 18446744073709551616 does not fit"):
        encode_dataproto(DataProto(meta_info={"big": 2**64}))
    with pytest.raises(ValueError, match=r"meta 'd': dict keys must be strings"):
        encode_dataproto(DataProto(meta_info={"d": {1: "a"}}))


def test_message_with_data_field_twice_is_rejected():
    one = encode_message(reward_pb2.ScoreRequest(), DataProto({"x": torch.zeros(1)}))
    with pytest.raises(ValueError, match="field `data` appears twice"):
        decode_message(reward_pb2.ScoreRequest, one + one)


def test_plain_columns_travel_as_typed_lists():
    data = DataProto(
        non_tensor_batch={
            "s": ["a", "b"],
            "i": [1, 2],
            "f": [0.5, 1.5],
            "b": [True, False],
            "mixed": [1, "a"],
            "none": [None, "x"],
        }
    )
    msg = to_proto(data)
    assert list(msg.non_tensors["s"].strings) == ["a", "b"] and list(msg.non_tensors["i"].ints) == [1, 2]
    assert list(msg.non_tensors["f"].floats) == [0.5, 1.5] and list(msg.non_tensors["b"].bools) == [True, False]
    assert len(msg.non_tensors["mixed"].values) == 2 and len(msg.non_tensors["none"].values) == 2
    assert_same(data, from_proto(msg))


def test_a_column_in_two_lists_is_refused():
    buf = raw([], 1, non_tensors={"s": pb.Column(strings=["a"], ints=[1])})
    with pytest.raises(ValueError, match="non_tensor 's': column holds values in more than one list"):
        decode_dataproto(buf)
