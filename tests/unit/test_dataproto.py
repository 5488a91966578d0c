"""DataProto operations: shapes, values, and the errors they raise."""

import numpy as np
import pytest
import torch

from meshrl.dataproto import DataProto, object_array, pad_to_divisor, unpad


def batch(n=6):
    return DataProto.from_single_dict(
        {
            "ids": torch.arange(n * 3).view(n, 3),
            "mask": torch.arange(n) % 2 == 0,
            "src": [f"s{i}" for i in range(n)],
            "rm": [{"ground_truth": str(i)} for i in range(n)],
        },
        meta_info={"temperature": 1.0},
    )


def test_len_and_split_kinds():
    d = batch()
    assert len(d) == 6
    assert set(d.batch) == {"ids", "mask"}
    assert set(d.non_tensor_batch) == {"src", "rm"}
    assert d.non_tensor_batch["rm"].dtype == object and d.non_tensor_batch["rm"].shape == (6,)


def test_object_array_keeps_lists_as_rows():
    a = object_array([[{"role": "user", "content": "1+1="}], [{"role": "user", "content": "2+2="}]])
    assert a.shape == (2,) and a[1][0]["content"] == "2+2="


def test_inconsistent_rows_name_the_field():
    with pytest.raises(ValueError, match=r"batch\['b'\] has 3 rows but the batch has 2"):
        DataProto({"a": torch.zeros(2), "b": torch.zeros(3)})
    with pytest.raises(ValueError, match=r"non_tensor_batch\['s'\] has 1 rows"):
        DataProto({"a": torch.zeros(2)}, {"s": ["x"]})
    with pytest.raises(ValueError, match="scalar"):
        DataProto({"a": torch.tensor(1.0)})


def test_select_pop_rename():
    d = batch()
    s = d.select(["ids"], ["src"], [])
    assert set(s.batch) == {"ids"} and set(s.non_tensor_batch) == {"src"} and s.meta_info == {}
    assert s.batch["ids"] is d.batch["ids"]  # shared, not copied
    popped = d.pop(batch_keys=["mask"], non_tensor_batch_keys=["rm"])
    assert set(d.batch) == {"ids"} and set(popped.batch) == {"mask"} and set(popped.non_tensor_batch) == {"rm"}
    d.rename("ids", "input_ids")
    assert set(d.batch) == {"input_ids"}
    with pytest.raises(KeyError, match="no key"):
        d.select(["nope"])


def test_union_merges_and_refuses_conflicts():
    d = batch()
    extra = DataProto({"scores": torch.ones(6)}, meta_info={"step": 3})
    d.union(extra)
    assert "scores" in d.batch and d.meta_info == {"temperature": 1.0, "step": 3}
    before = dict(d.batch)
    with pytest.raises(ValueError, match=r"batch\['scores'\] differs"):
        d.union(DataProto({"scores": torch.zeros(6), "new": torch.zeros(6)}))
    assert d.batch == before  # a failed union changes nothing
    with pytest.raises(ValueError, match="6 and 2 rows"):
        d.union(DataProto({"x": torch.zeros(2)}))


def test_index_slice_and_mask():
    d = batch()
    row = d[2]
    assert torch.equal(row.batch["ids"], torch.tensor([6, 7, 8])) and row.non_tensor_batch["src"] == "s2"
    s = d[1:5:2]
    assert len(s) == 2 and list(s.non_tensor_batch["src"]) == ["s1", "s3"]
    assert s.batch["ids"].data_ptr() == d.batch["ids"][1].data_ptr()  # a view
    picked = d[torch.tensor([5, 0])]
    assert list(picked.non_tensor_batch["src"]) == ["s5", "s0"]
    masked = d[np.array([True, False] * 3)]
    assert list(masked.non_tensor_batch["src"]) == ["s0", "s2", "s4"]
    with pytest.raises(ValueError, match="boolean mask"):
        d[np.array([True, False])]


def test_chunk_split_concat_roundtrip():
    d = batch()
    parts = d.chunk(3)
    assert [len(p) for p in parts] == [2, 2, 2]
    back = DataProto.concat(parts)
    assert torch.equal(back.batch["ids"], d.batch["ids"])
    assert list(back.non_tensor_batch["src"]) == list(d.non_tensor_batch["src"])
    assert [len(p) for p in d.split(4)] == [4, 2]
    with pytest.raises(ValueError, match="do not split into 4 equal chunks"):
        d.chunk(4)
    with pytest.raises(ValueError, match="keys"):
        DataProto.concat([d, d.select(["ids"])])
    with pytest.raises(ValueError, match="disagrees"):
        DataProto.concat(
            [
                d[:2],
                DataProto.from_single_dict({**d[2:].batch, **d[2:].non_tensor_batch}, meta_info={"temperature": 0.5}),
            ]
        )


def test_repeat_interleaved_and_tiled():
    d = batch(2)
    r = d.repeat(3, interleave=True)
    assert list(r.non_tensor_batch["src"]) == ["s0"] * 3 + ["s1"] * 3
    assert torch.equal(r.batch["ids"][:, 0], torch.tensor([0, 0, 0, 3, 3, 3]))
    t = d.repeat(2, interleave=False)
    assert list(t.non_tensor_batch["src"]) == ["s0", "s1", "s0", "s1"]
    assert torch.equal(t.batch["ids"][:, 0], torch.tensor([0, 3, 0, 3]))


@pytest.mark.parametrize("n,k,pad", [(6, 4, 2), (6, 3, 0), (2, 7, 5), (1, 1, 0)])
def test_pad_to_divisor_and_unpad(n, k, pad):
    d = batch(n)
    padded, pad_size = pad_to_divisor(d, k)
    assert pad_size == pad and len(padded) % k == 0
    # padding repeats rows from the start, as verl does
    assert list(padded.non_tensor_batch["src"][n:]) == [f"s{i % n}" for i in range(pad)]
    back = unpad(padded, pad_size)
    assert torch.equal(back.batch["ids"], d.batch["ids"])


def test_meta_only_dataproto_has_no_rows():
    d = DataProto(meta_info={"eos_token_id": 2})
    assert len(d) == 0 and not d.has_rows()
    d.union(batch(3))
    assert len(d) == 3
