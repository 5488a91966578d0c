"""Losses, KL estimators, controllers and DPO pairs against values worked out by hand."""

import math

import pytest
import torch

from meshrl.algos.kl import AdaptiveKLController, FixedKLController, apply_kl_penalty, kl_penalty
from meshrl.algos.losses import (
    dpo_loss,
    kl_loss,
    sft_loss,
    value_loss,
)
from meshrl.algos.masked import agg_loss
from meshrl.algos.pairs import best_worst_pairs
from meshrl.algos.policy_losses import gspo_policy_loss, ppo_policy_loss
from meshrl.algos.rollout_correction import rollout_is_weights
from meshrl.algos.shaping import overlong_penalty


def t(*rows):
    return torch.tensor(rows, dtype=torch.float32)


def test_agg_loss_modes_by_hand():
    loss = t([1.0, 2.0, 3.0], [4.0, 0.0, 0.0])
    mask = t([1, 1, 1], [1, 0, 0])
    assert agg_loss(loss, mask, "token-mean").item() == pytest.approx(10 / 4)
    assert agg_loss(loss, mask, "seq-mean-token-sum").item() == pytest.approx((6 + 4) / 2)
    assert agg_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)
    assert agg_loss(loss, mask, "seq-mean-token-sum-norm").item() == pytest.approx((6 / 3 + 4 / 3) / 2)
    with pytest.raises(ValueError, match="loss_agg_mode must be one of"):
        agg_loss(loss, mask, "sum")


def test_ppo_clip_by_hand():
    old = torch.zeros(1, 4)
    # ratios 1.5 (A>0, clipped to 1.2), 0.5 (A>0, not clipped: min wins), 0.5 (A<0, clipped at 0.8), 1.1 (A<0)
    logp = torch.log(t([1.5, 0.5, 0.5, 1.1]))
    adv = t([1.0, 1.0, -1.0, -2.0])
    mask = torch.ones(1, 4)
    loss, m = ppo_policy_loss(logp, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=None)
    per_token = [-1.2, -0.5, 0.8, 2.2]
    assert loss.item() == pytest.approx(sum(per_token) / 4, rel=1e-5)
    assert m["actor/pg_clipfrac"] == pytest.approx(2 / 4)  # tokens 0 and 2


def test_gspo_clips_each_sequence_as_a_whole_by_hand():
    # sequence 0: token log-ratios 0.1 and 0.3 -> s = exp(0.2) = 1.221, A = +1: clipped at 1 + 0.1 as a whole;
    # sequence 1: log-ratios -0.1 and (padding) -> s = exp(-0.1) = 0.905, A = -2: inside [0.8, 1.1], not clipped
    old = torch.zeros(2, 2)
    logp = t([0.1, 0.3], [-0.1, 5.0]).requires_grad_()
    adv = t([1.0, 1.0], [-2.0, -2.0])
    mask = t([1, 1], [1, 0])
    loss, m = gspo_policy_loss(logp, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.1)
    s1 = math.exp(-0.1)
    assert loss.item() == pytest.approx((-1.1 + 2 * s1) / 2, rel=1e-5)  # each sequence's token mean, then theirs
    assert m["actor/pg_clipfrac"] == pytest.approx(1 / 2)  # sequence 0, whole
    assert m["actor/seq_ratio_mean"] == pytest.approx((math.exp(0.2) + s1) / 2, rel=1e-5)
    loss.backward()
    # the clipped sequence teaches nothing; the other's one token: d/dlogp of (2 s / 1) / 2 sequences = s
    assert logp.grad.tolist()[0] == [0.0, 0.0]
    assert logp.grad[1, 0].item() == pytest.approx(s1, rel=1e-5) and logp.grad[1, 1].item() == 0.0


def test_gspo_gradient_is_the_sequence_ratio_times_the_mean_token_gradient():
    # unclipped, A = 1: loss = -s over one sequence of 3 tokens; d(-s)/dlogp_t = -s / 3 for every token
    old = t([0.0, 0.0, 0.0])
    logp = t([0.05, -0.02, 0.03]).requires_grad_()
    loss, _ = gspo_policy_loss(logp, old, t([1.0, 1.0, 1.0]), torch.ones(1, 3), clip_ratio_low=0.2, clip_ratio_high=0.2)
    s = math.exp((0.05 - 0.02 + 0.03) / 3)
    assert loss.item() == pytest.approx(-s, rel=1e-6)
    loss.backward()
    assert logp.grad.tolist()[0] == pytest.approx([-s / 3] * 3, rel=1e-5)
    # one token per sequence: GSPO is PPO's clipped ratio without dual clip
    logp1, old1, adv1, mask1 = t([0.4], [-0.3]), torch.zeros(2, 1), t([1.0], [-1.0]), torch.ones(2, 1)
    g, _ = gspo_policy_loss(logp1, old1, adv1, mask1, clip_ratio_low=0.2, clip_ratio_high=0.2)
    p, _ = ppo_policy_loss(logp1, old1, adv1, mask1, clip_ratio_c=None, loss_agg_mode="seq-mean-token-mean")
    assert g.item() == pytest.approx(p.item(), rel=1e-6)


def test_rollout_is_weights_by_hand():
    old = t([-1.0, -2.0, -0.5], [-1.0, -1.0, 0.0])
    mask = t([1, 1, 1], [1, 1, 0])
    w, m = rollout_is_weights(old, old.clone(), mask, "token", 2.0)  # the rollout is the policy: no correction
    assert torch.equal(w, torch.ones(2, 3)) and m["actor/rollout_is_capped_frac"] == 0.0
    # log-ratios old - rollout: row 0 [ln 1.5, ln 3, ln 0.5], row 1 [ln 0.25, ln 1.2, (masked) ln 10]
    rollout = old - torch.log(t([1.5, 3.0, 0.5], [0.25, 1.2, 10.0]))
    w, m = rollout_is_weights(old, rollout, mask, "token", 2.0)
    assert torch.allclose(w[0], t(1.5, 2.0, 0.5)) and torch.allclose(w[1, :2], t(0.25, 1.2))
    assert m["actor/rollout_is_mean"] == pytest.approx((1.5 + 2.0 + 0.5 + 0.25 + 1.2) / 5, rel=1e-6)
    assert m["actor/rollout_is_capped_frac"] == pytest.approx(1 / 5)  # only the 3; the masked 10 is no token
    w, m = rollout_is_weights(old, rollout, mask, "sequence", 2.0)  # products: 2.25 (capped), 0.3
    assert torch.allclose(w, t([2.0] * 3, [0.3] * 3)) and m["actor/rollout_is_capped_frac"] == pytest.approx(0.5)
    assert not w.requires_grad
    # the weights scale each token's loss: on-policy (ratio 1) with A = 1 the loss is -mean(w)
    adv = torch.ones(2, 3)
    loss, _ = ppo_policy_loss(old, old, adv, mask, weights=w)
    assert loss.item() == pytest.approx(-(3 * 2.0 + 2 * 0.3) / 5, rel=1e-6)


def test_ppo_asymmetric_clip():
    logp, old, adv, mask = torch.log(t([1.25])), torch.zeros(1, 1), t([1.0]), torch.ones(1, 1)
    loss, _ = ppo_policy_loss(logp, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=None)
    assert loss.item() == pytest.approx(-1.25)  # inside the wider high clip
    loss, _ = ppo_policy_loss(logp, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=None)
    assert loss.item() == pytest.approx(-1.2)


def test_ppo_dual_clip_bounds_negative_advantages():
    logp, old, mask = torch.log(t([10.0])), torch.zeros(1, 1), torch.ones(1, 1)
    loss, m = ppo_policy_loss(logp, old, t([-1.0]), mask, clip_ratio_c=3.0)
    assert loss.item() == pytest.approx(3.0)  # -A * ratio = 10, bounded by -A * c = 3
    assert m["actor/pg_clipfrac_lower"] == 1.0
    loss, _ = ppo_policy_loss(logp, old, t([-1.0]), mask, clip_ratio_c=None)
    assert loss.item() == pytest.approx(10.0)
    with pytest.raises(ValueError, match="clip_ratio_c must be > 1"):
        ppo_policy_loss(logp, old, t([-1.0]), mask, clip_ratio_c=0.5)


def test_ppo_gradient_raises_logprob_of_positive_advantage():
    logp = torch.zeros(1, 2, requires_grad=True)
    loss, _ = ppo_policy_loss(logp, torch.zeros(1, 2), t([1.0, -1.0]), torch.ones(1, 2))
    loss.backward()
    assert logp.grad[0, 0] < 0 < logp.grad[0, 1]  # descent raises token 0, lowers token 1


def test_kl_estimators_by_hand():
    logp, ref = t([math.log(0.5)]), t([math.log(0.25)])
    k1 = math.log(0.5) - math.log(0.25)  # log 2
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(k1)
    assert kl_penalty(logp, ref, "abs").item() == pytest.approx(k1)
    assert kl_penalty(logp, ref, "k2").item() == pytest.approx(0.5 * k1**2)
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(0.5 - 1 + k1)  # r - 1 - log r with r = 0.5
    with pytest.raises(ValueError, match="kl estimator must be one of"):
        kl_penalty(logp, ref, "k4")


def test_kl_penalty_in_the_reward():
    scores = t([0.0, 0.0, 1.0])
    logp, ref = t([0.1, 0.2, 0.3]), t([0.0, 0.0, 0.0])
    mask = t([1.0, 1.0, 0.0])
    rewards, mean_kl = apply_kl_penalty(scores, logp, ref, mask, beta=0.5, estimator="k1")
    assert torch.allclose(rewards, t([-0.05, -0.1, 1.0]))
    assert mean_kl.item() == pytest.approx(0.15)


def test_kl_controllers():
    fixed = FixedKLController(0.1)
    fixed.update(5.0, 100)
    assert fixed.value == 0.1
    ada = AdaptiveKLController(value=0.1, target=1.0, horizon=1000)
    ada.update(current_kl=1.5, n_steps=100)  # error 0.5 clipped to 0.2
    assert ada.value == pytest.approx(0.1 * (1 + 0.2 * 0.1))
    ada.update(current_kl=0.9, n_steps=100)  # error -0.1
    assert ada.value == pytest.approx(0.1 * 1.02 * (1 - 0.01))


def test_kl_loss_uses_the_estimator():
    loss, m = kl_loss(t([0.0]), t([0.0]), t([1.0]), "k3")
    assert loss.item() == 0.0 and m["actor/kl_loss"] == 0.0


def test_value_loss_by_hand():
    values, old, returns = t([1.0, 0.0]), t([0.0, 0.0]), t([0.0, 1.0])
    loss, m = value_loss(values, old, returns, torch.ones(1, 2), clip_range_value=0.5)
    # token 0: unclipped (1-0)^2 = 1, clipped (0.5-0)^2 = 0.25 -> max 1
    # token 1: (0-1)^2 = 1 both -> 1
    assert loss.item() == pytest.approx(0.5 * 1.0)
    assert m["critic/vf_clipfrac"] == 0.0
    loss, m = value_loss(t([0.0]), t([0.0]), t([0.0]), torch.ones(1, 1))
    assert loss.item() == 0.0


def test_dpo_sigmoid_and_ipo_by_hand():
    c, r, rc, rr = torch.tensor([-1.0]), torch.tensor([-3.0]), torch.tensor([-2.0]), torch.tensor([-2.0])
    h = (-1 + 2) - (-3 + 2)  # 2
    loss, m = dpo_loss(c, r, rc, rr, beta=0.1)
    assert loss.item() == pytest.approx(-math.log(1 / (1 + math.exp(-0.1 * h))))
    assert m["actor/reward_accuracy"] == 1.0 and m["actor/reward_margin"] == pytest.approx(0.2)
    loss, _ = dpo_loss(c, r, rc, rr, beta=0.1, loss_type="ipo")
    assert loss.item() == pytest.approx((h - 1 / 0.2) ** 2)
    with pytest.raises(ValueError, match="dpo loss_type"):
        dpo_loss(c, r, rc, rr, loss_type="hinge2")


def test_dpo_gradient_widens_the_margin():
    c = torch.tensor([-2.0], requires_grad=True)
    r = torch.tensor([-2.0], requires_grad=True)
    loss, _ = dpo_loss(c, r, torch.tensor([-2.0]), torch.tensor([-2.0]), beta=0.5)
    loss.backward()
    assert c.grad.item() < 0 < r.grad.item()


def test_sft_loss_is_masked_nll():
    logp = torch.log(t([0.5, 0.25, 0.1]))
    loss, _ = sft_loss(logp, t([1.0, 1.0, 0.0]))
    assert loss.item() == pytest.approx(-(math.log(0.5) + math.log(0.25)) / 2)


def test_online_dpo_pairs_best_vs_worst_skipping_ties():
    scores = torch.tensor([0.0, 1.0, 0.5, 2.0, 2.0, 3.0, 1.0])
    index = ["a", "a", "a", "b", "b", "c", "c"]
    chosen, rejected = best_worst_pairs(scores, index)
    assert (chosen, rejected) == ([1, 5], [0, 6])  # b is a tie: skipped


def test_dapo_overlong_penalty_by_hand():
    # limit 10, buffer 4: nothing up to 6 tokens, then -1/4 per token over 6, -1 x factor at 10
    lengths = [3, 6, 7, 9, 10]
    mask = torch.tensor([[1] * n + [0] * (10 - n) for n in lengths], dtype=torch.float32)
    assert overlong_penalty(mask, 10, 4).tolist() == pytest.approx([0.0, 0.0, -0.25, -0.75, -1.0])
    assert overlong_penalty(mask, 10, 4, factor=0.5).tolist() == pytest.approx([0.0, 0.0, -0.125, -0.375, -0.5])
    with pytest.raises(ValueError, match="overlong buffer must be in 1..10"):
        overlong_penalty(mask, 10, 11)
