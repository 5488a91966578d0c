"""The parts of sequence parallelism that need no process group (services/actor/sequence.py); the exchanges
themselves run on real gloo groups in tests/contract/test_engines.py."""

import pytest
import torch
from transformers import Qwen2Config

from services.actor.sequence import Shards, check_heads, kv_heads_for


def test_each_rank_takes_its_slice_of_a_row_padded_to_the_group():
    row = torch.arange(1, 8)  # 7 tokens over 3 ranks: 3 each, the last two padding
    slices = [Shards(None, 3, r).mine(row) for r in range(3)]
    assert [s.tolist() for s in slices] == [[1, 2, 3], [4, 5, 6], [7, 0, 0]]
    mask = Shards(None, 3, 2).mine(torch.ones(7, 2, dtype=torch.bool))  # any dtype, any trailing shape
    assert mask.tolist() == [[True, True], [False, False], [False, False]]


def test_key_value_heads_that_do_not_split_are_repeated_to_the_query_heads():
    k = torch.arange(2.0)[:, None, None].expand(2, 3, 1)  # 2 kv heads of 8 query heads
    assert kv_heads_for(k, 8, 2) is k  # 2 split over 2
    repeated = kv_heads_for(k, 8, 4)  # query heads 0-3 read kv head 0, 4-7 kv head 1, as before
    assert repeated[:, 0, 0].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]


def test_heads_that_do_not_split_are_refused_by_name():
    check_heads(Qwen2Config(num_attention_heads=4, hidden_size=64), 2)
    with pytest.raises(ValueError, match="model's 4 attention heads do not split over 3 ranks"):
        check_heads(Qwen2Config(num_attention_heads=4, hidden_size=64), 3)
