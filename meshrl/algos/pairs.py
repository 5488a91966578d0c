"""Online DPO pairs: per prompt, the best-scored response against the worst, ties skipped."""

from collections import defaultdict
from collections.abc import Sequence

import torch


def best_worst_pairs(scores: torch.Tensor, index: Sequence) -> tuple[list[int], list[int]]:
    """(chosen rows, rejected rows), one pair per prompt whose responses do not all score the same.

    scores (B,), index (B,): the prompt id of each response. Among equal best (worst) scores the
    first row wins, so the pairs are deterministic.
    """
    groups: dict = defaultdict(list)
    for i, key in enumerate(index):
        groups[key].append(i)
    chosen, rejected = [], []
    for rows in groups.values():
        s = scores[rows]
        best, worst = int(torch.argmax(s)), int(torch.argmin(s))
        if s[best] > s[worst]:
            chosen.append(rows[best])
            rejected.append(rows[worst])
    return chosen, rejected
