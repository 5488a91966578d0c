"""rollout.chunks: a step's Generate replies and Scores, joined from consecutive parts, are what one call
gives (the rollout's own layout code builds both)."""

import dataclasses

import numpy as np
import pytest
import torch

from meshrl.algos.router_replay import ROUTED
from meshrl.clients.reward import Scores
from meshrl.dataproto import DataProto
from meshrl.layout import VERSIONS
from orchestrator.lifecycle.fleet import join_generations, starts
from services.rollout import layout
from services.rollout.sampling import Completion

PAD = 0


def reply(prompts, completions, version=3):
    data = DataProto(non_tensor_batch={"uid": [f"u{p[0]}" for p in prompts]})
    out = layout.build(data, prompts, completions, PAD, with_logprobs=True)
    out.meta_info["weight_version"] = version
    return out


def completion(tokens):
    return Completion(tokens, [-0.1 * (i + 1) for i in range(len(tokens))], "t" * len(tokens), "stop")


PROMPTS = [[5, 6, 7], [8], [9, 10, 11, 12, 13], [14, 15]]  # of different lengths, so each part pads its own
SAMPLES = [
    [completion([20, 21]), completion([22])],
    [completion([23] * 6), completion([24, 25])],
    [completion([26]), completion([27, 28, 29])],
    [completion([30] * 2), completion([31] * 4)],
]


@pytest.mark.parametrize("cut", [[0, 1, 4], [0, 2, 4], [0, 1, 2, 3, 4]])
def test_joined_parts_equal_one_reply(cut):
    whole = reply(PROMPTS, SAMPLES)
    parts = [reply(PROMPTS[a:b], SAMPLES[a:b]) for a, b in zip(cut, cut[1:])]
    joined = join_generations(parts)
    assert set(joined.batch) == set(whole.batch)
    for k, t in whole.batch.items():
        assert torch.equal(joined.batch[k], t), k
    for k, col in whole.non_tensor_batch.items():
        assert list(joined.non_tensor_batch[k]) == list(col), k


def with_experts(prompts, samples):
    """The samples with routed experts (routing replay R3), distinct per token: (prompt + response - 1, 2, 2)."""
    out = []
    for p, cs in zip(prompts, samples):
        row = []
        for c in cs:
            n = len(p) + len(c.token_ids) - 1
            experts = (np.arange(n * 4).reshape(n, 2, 2) + 7 * len(p)) % 200
            row.append(dataclasses.replace(c, routed_experts=experts.astype(np.uint8)))
        out.append(row)
    return out


@pytest.mark.parametrize("cut", [[0, 1, 4], [0, 2, 4]])
def test_joined_parts_equal_one_reply_with_routed_experts(cut):
    samples = with_experts(PROMPTS, SAMPLES)
    whole = reply(PROMPTS, samples)
    routed = whole.batch[ROUTED]
    assert routed.shape == (*whole.batch["input_ids"].shape, 2, 2) and routed.dtype == torch.uint8
    first = samples[1][0]  # prompt [8] at the right of the prompt columns, its response after it
    P = whole.batch["prompts"].shape[1]
    assert torch.equal(routed[2, P - 1 : P + 5], torch.from_numpy(first.routed_experts))
    joined = join_generations([reply(PROMPTS[a:b], samples[a:b]) for a, b in zip(cut, cut[1:])])
    assert torch.equal(joined.batch[ROUTED], routed)


def test_the_oldest_weight_version_stands_for_the_joined_batch():
    parts = [reply(PROMPTS[:2], SAMPLES[:2], version=4), reply(PROMPTS[2:], SAMPLES[2:], version=5)]
    assert join_generations(parts).meta_info["weight_version"] == 4


def test_joined_scores():
    a = Scores(
        torch.tensor([1.0, 0.0]),
        torch.tensor([[0.0, 1.0], [0.0, 0.0]]),
        {"acc": np.array([True, False], dtype=object), "reward_error": np.array(["", "boom"], dtype=object)},
        {"reward/num_failed": 1.0, "reward/score/mean": 0.5},
    )
    b = Scores(
        torch.tensor([1.0, 1.0, 1.0, 0.0]),
        torch.tensor([[1.0], [1.0], [1.0], [0.0]]),
        {"acc": np.array([True] * 3 + [False], dtype=object)},
        {"reward/num_failed": 0.0, "reward/score/mean": 0.75},
    )
    s = Scores.join([a, b], width=3)
    assert torch.equal(s.scores, torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0, 0.0]))
    assert torch.equal(
        s.token_level_scores, torch.tensor([[0.0, 1.0, 0], [0, 0, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0], [0, 0, 0]])
    )
    assert list(s.columns["acc"]) == [True, False, True, True, True, False]
    assert list(s.columns["reward_error"]) == ["", "boom", None, None, None, None]
    assert s.metrics == {"reward/num_failed": 1.0, "reward/score/mean": (2 * 0.5 + 4 * 0.75) / 6}


def test_starts():
    assert starts(10, 3) == [0, 3, 6]
    assert starts(2, 4) == [0, 1]  # never an empty call
    assert starts(5, 1) == [0]


@pytest.mark.parametrize("cut", [[0, 1, 4], [0, 2, 4]])
def test_joined_parts_with_token_versions_equal_one_reply(cut):
    """rollout.on_update=keep: each part's per-token versions (samples switching where the update found them)
    join as one reply's, 0 past each response; the batch's version is the oldest."""
    samples = [[dataclasses.replace(c, switches=[1]) for c in cs] for cs in SAMPLES]

    def with_versions(a, b, steps):
        out = reply(PROMPTS[a:b], samples[a:b], version=steps[0])
        rows = [c for cs in samples[a:b] for c in cs]
        out.batch[VERSIONS] = layout.token_versions(out.batch["response_mask"], rows, [steps[0]] * 3, steps)
        return out

    whole = with_versions(0, 4, [4, 5])
    assert whole.batch[VERSIONS][2].tolist() == [4, 5, 5, 5, 5, 5]  # [23] * 6: its first token before the switch
    parts = [with_versions(a, b, [4, 5]) for a, b in zip(cut, cut[1:])]
    joined = join_generations(parts)
    assert torch.equal(joined.batch[VERSIONS], whole.batch[VERSIONS])
    assert joined.meta_info["weight_version"] == 4
