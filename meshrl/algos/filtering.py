"""DAPO's dynamic sampling (Yu et al. 2025, arXiv:2503.14476, "dynamic sampling"; verl's filter_groups): a
group whose samples all got the same score (all right or all wrong) has zero group-relative advantage
and teaches nothing, so it is dropped and more prompts are sampled until the batch is full.

    keep = varied_groups(uids, values)        # uids of groups whose values differ, in first-seen order
    rows = rows_of(uids, keep[:want])         # their rows, in order
"""

from collections.abc import Sequence


def varied_groups(uids: Sequence[str], values: Sequence[float]) -> list[str]:
    """The uids, in the order they first appear, of the groups whose values are not all equal (a group of
    one sample never varies)."""
    if len(uids) != len(values):
        raise ValueError(f"{len(uids)} uids for {len(values)} values")
    seen: dict[str, set[float]] = {}
    for uid, value in zip(uids, values):
        seen.setdefault(uid, set()).add(float(value))
    return [uid for uid, group in seen.items() if len(group) > 1]


def rows_of(uids: Sequence[str], kept: Sequence[str]) -> list[int]:
    """Indices of the rows whose uid is in `kept`, in row order."""
    wanted = set(kept)
    return [i for i, uid in enumerate(uids) if uid in wanted]
