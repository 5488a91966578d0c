"""Advantage estimators against values worked out by hand."""

import math

import pytest
import torch

from meshrl.algos.advantages import (
    ADVANTAGE_ESTIMATORS,
    compute_gae,
    compute_grpo,
    compute_reinforce_plus_plus,
    compute_reinforce_plus_plus_baseline,
    compute_rloo,
)
from meshrl.algos.masked import masked_mean, masked_var, masked_whiten


def outcome(scores, length=3):
    """Rewards with each score on the last token of a length-`length` response."""
    r = torch.zeros(len(scores), length)
    r[:, -1] = torch.tensor(scores, dtype=torch.float32)
    return r, torch.ones(len(scores), length)


def test_gae_by_hand():
    # one row, T=3, gamma=0.9, lam=0.8
    r = torch.tensor([[0.0, 0.0, 1.0]])
    v = torch.tensor([[0.5, 0.6, 0.7]])
    m = torch.ones(1, 3)
    adv, ret = compute_gae(r, v, m, gamma=0.9, lam=0.8, whiten=False)
    d2 = 1.0 - 0.7  # last step: no next value
    d1 = 0.0 + 0.9 * 0.7 - 0.6  # 0.03
    d0 = 0.0 + 0.9 * 0.6 - 0.5  # 0.04
    a2 = d2
    a1 = d1 + 0.72 * a2
    a0 = d0 + 0.72 * a1
    assert torch.allclose(adv, torch.tensor([[a0, a1, a2]]))
    assert torch.allclose(ret, torch.tensor([[a0 + 0.5, a1 + 0.6, a2 + 0.7]]))


def test_gae_skips_padding():
    r = torch.tensor([[0.0, 1.0, 0.0, 0.0]])
    v = torch.tensor([[0.2, 0.4, 9.0, 9.0]])  # garbage values on padding must not leak in
    m = torch.tensor([[1.0, 1.0, 0.0, 0.0]])
    adv, ret = compute_gae(r, v, m, gamma=1.0, lam=1.0, whiten=False)
    assert torch.allclose(adv, torch.tensor([[0.8, 0.6, 0.0, 0.0]]))
    assert torch.allclose(ret, torch.tensor([[1.0, 1.0, 0.0, 0.0]]))


def test_gae_whitens_over_valid_tokens():
    r, m = outcome([1.0, 0.0])
    adv, _ = compute_gae(r, torch.zeros(2, 3), m, whiten=True)
    assert abs(masked_mean(adv, m).item()) < 1e-6
    assert abs(masked_var(adv, m).item() - 1.0) < 1e-4


def test_grpo_by_hand():
    r, m = outcome([1.0, 0.0, 0.0, 1.0, 5.0])
    adv, ret = compute_grpo(r, m, index=["a", "a", "a", "a", "b"])
    # group a: mean 0.5, unbiased std sqrt(1/3); group b alone: passes through
    std = math.sqrt(1 / 3)
    expected = [0.5 / (std + 1e-6), -0.5 / (std + 1e-6), -0.5 / (std + 1e-6), 0.5 / (std + 1e-6), 5.0]
    assert torch.allclose(adv[:, 0], torch.tensor(expected))
    assert torch.equal(adv, ret) and torch.equal(adv[:, 0], adv[:, 2])


def test_dr_grpo_does_not_divide_by_std():
    r, m = outcome([1.0, 0.0, 0.0, 1.0])
    adv, _ = compute_grpo(r, m, index=[0, 0, 0, 0], norm_by_std=False)
    assert adv[:, 0].tolist() == [0.5, -0.5, -0.5, 0.5]


def test_grpo_masks_padding():
    r = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    m = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv, _ = compute_grpo(r, m, index=[0, 0], norm_by_std=False)
    assert adv.tolist() == [[0.5, 0.5], [-0.5, 0.0]]


def test_rloo_by_hand():
    r, m = outcome([3.0, 1.0, 2.0, 7.0])
    adv, _ = compute_rloo(r, m, index=[0, 0, 0, 1])
    # 3 - mean(1, 2) = 1.5; 1 - mean(3, 2) = -1.5; 2 - mean(3, 1) = 0; alone: 7
    assert adv[:, 0].tolist() == [1.5, -1.5, 0.0, 7.0]


def test_reinforce_plus_plus_returns_by_hand():
    r = torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]])
    m = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, ret = compute_reinforce_plus_plus(r, m, gamma=0.5)
    # row 0: G2 = 2, G1 = 0 + 0.5*2 = 1, G0 = 1 + 0.5*1 = 1.5; row 1: G1 = 3, G0 = 1.5, padding 0
    assert torch.allclose(ret, torch.tensor([[1.5, 1.0, 2.0], [1.5, 3.0, 0.0]]))
    assert torch.allclose(adv, masked_whiten(ret, m) * m)


def test_reinforce_plus_plus_baseline_by_hand():
    r, m = outcome([1.0, 3.0, 4.0], length=2)
    adv, tokens = compute_reinforce_plus_plus_baseline(r, m, index=[0, 0, 1])
    assert tokens[:, 0].tolist() == [-1.0, 1.0, 4.0]  # group 0 minus its mean 2; a group of one keeps its score
    assert torch.allclose(adv, masked_whiten(tokens, m) * m)


def test_estimators_are_named_explicitly():
    assert set(ADVANTAGE_ESTIMATORS) == {"gae", "grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"}


def test_masked_var_and_whiten_by_hand():
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    m = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    assert masked_mean(x, m).item() == pytest.approx(2.0)
    assert masked_var(x, m).item() == pytest.approx(1.0)  # unbiased: ((1 + 0 + 1) / 3) * 3 / 2
    w = masked_whiten(x, m)
    assert torch.allclose(w[0, :3], torch.tensor([-1.0, 0.0, 1.0]), atol=1e-4)
