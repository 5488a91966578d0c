"""DAPO's group filter, on hand-worked groups."""

import pytest

from meshrl.algos.filtering import rows_of, varied_groups


def test_groups_that_all_scored_the_same_are_dropped_in_first_seen_order():
    uids = ["b", "b", "a", "a", "c", "c", "d"]
    values = [1, 0, 1, 1, 0.0, 0.5, 1]  # b varies, a all right, c varies, d a single sample
    assert varied_groups(uids, values) == ["b", "c"]
    assert rows_of(uids, ["c"]) == [4, 5] and rows_of(uids, ["b", "c"]) == [0, 1, 4, 5]
    assert varied_groups(["x", "y", "x", "y"], [0, 0, 0, 0]) == []  # interleaved groups, none varies


def test_mismatched_lengths_are_refused():
    with pytest.raises(ValueError, match="3 uids for 2 values"):
        varied_groups(["a", "a", "b"], [1, 0])
