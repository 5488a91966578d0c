"""The hf backend's per-sample sampler (services/rollout/row_sampler.py): the distribution it draws from,
and each row's pick depending on its own scores and seed alone."""

import torch

from services.rollout.row_sampler import RowSampler


def picks(sampler: RowSampler, scores: torch.Tensor) -> torch.Tensor:
    out = sampler(torch.zeros(scores.shape[0], 1, dtype=torch.long), scores)
    assert ((out == 0).sum(-1) == 1).all() and (out[out != 0] == -torch.inf).all()  # one-hot for generate's argmax
    return out.argmax(-1)


def test_it_samples_softmax_over_the_temperature_and_never_a_cut_token():
    logits = torch.tensor([2.0, 1.0, 0.5, -1.0, -torch.inf])
    rows = 20_000
    for temperature, top_k, top_p, kept in ((0.7, -1, 1.0, 4), (1.0, 2, 1.0, 2), (1.0, -1, 0.7, 2)):
        probs = torch.softmax(logits / temperature, -1)[:kept]
        probs = torch.cat([probs / probs.sum(), torch.zeros(5 - kept)])
        got = picks(RowSampler(list(range(rows)), 1, temperature, top_k, top_p), logits.repeat(rows, 1))
        freq = torch.bincount(got, minlength=5).double() / rows
        assert (freq[kept:] == 0).all(), (temperature, top_k, top_p, freq)
        assert torch.allclose(freq, probs.double(), atol=0.015), (temperature, top_k, top_p, freq, probs)


def test_a_rows_pick_depends_on_its_own_seed_and_scores_alone():
    scores = torch.randn(6, 50, generator=torch.Generator().manual_seed(0))
    whole = picks(RowSampler([10, 11, 12], 2, 1.0, -1, 1.0), scores)  # prompts 10..12, two samples each
    assert torch.equal(picks(RowSampler([11], 2, 1.0, -1, 1.0), scores[2:4]), whole[2:4])
    assert torch.equal(picks(RowSampler([12, 99], 2, 1.0, -1, 1.0), torch.cat([scores[4:], scores[:2]]))[:2], whole[4:])
    steps = RowSampler([10, 11, 12], 2, 1.0, -1, 1.0)
    assert len({tuple(picks(steps, scores).tolist()) for _ in range(5)}) > 1  # each step draws anew
