"""A broken reward for the learning test's negative control: each sample's real arithmetic score, shuffled
over the batch, so the reward says nothing about the sample it is given (same mean, no signal). `acc` stays
the real one, so held-out accuracy is still measured right."""

import random

from services.reward.scorers.arithmetic import compute_score as arithmetic


def compute_score(data_sources, solution_strs, ground_truths, extra_infos):
    real = [arithmetic(d, s, g, e) for d, s, g, e in zip(data_sources, solution_strs, ground_truths, extra_infos)]
    scores = [r["score"] for r in real]
    random.shuffle(scores)
    return [{"score": s, "acc": r["acc"]} for s, r in zip(scores, real)]
