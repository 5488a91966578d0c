"""The policy losses beyond PPO/GSPO (CISPO, GMPO, SAPO, Clip-Cov, KL-Cov) against values and gradients worked
out by hand from their papers' formulas, and the table that names them (POLICY_LOSS_FNS, POLICY_LOSSES,
PolicyLossSettings, policy_loss). PPO's and GSPO's own math is tests/unit/test_algos_losses.py's."""

import math

import pytest
import torch

from meshrl.algos.policy_losses import (
    POLICY_LOSS_FNS,
    READS,
    SETTINGS,
    cispo_policy_loss,
    clip_cov_policy_loss,
    gmpo_policy_loss,
    gspo_policy_loss,
    kl_cov_policy_loss,
    policy_loss,
    ppo_policy_loss,
    reads,
    sapo_policy_loss,
)
from meshrl.config.losses import POLICY_LOSSES, PolicyLossSettings


def t(*rows):
    return torch.tensor(rows, dtype=torch.float32)


def sig(x):
    return 1 / (1 + math.exp(-x))


MASK = t([1, 1, 1], [1, 1, 0])  # 2 rows x 3 tokens, the last one padding: N = 5 valid tokens


def test_cispo_keeps_every_tokens_gradient_where_ppo_drops_the_clipped_ones():
    # ratios row 0 [1.5, 1, 0.5] with A = +2, row 1 [0.5, 1.1, pad] with A = -1; old log-probs -1, so the
    # log-probs themselves (the paper's log pi factor) are -1 + ln r, not 0
    r = t([1.5, 1.0, 0.5], [0.5, 1.1, 3.0])
    old = torch.full((2, 3), -1.0)
    logp = (old + r.log()).requires_grad_()
    adv = t([2.0, 2.0, 2.0], [-1.0, -1.0, -1.0])
    loss, m = cispo_policy_loss(logp, old, adv, MASK, clip_ratio_low=0.2, clip_ratio_high=0.2)
    # sg(clip(r, 0.8, 1.2)) = [1.2, 1, 0.8], [0.8, 1.1]; loss = -(1/5) sum w A log pi
    lp = [-1 + math.log(1.5), -1.0, -1 + math.log(0.5), -1 + math.log(0.5), -1 + math.log(1.1)]
    wa = [1.2 * 2, 1.0 * 2, 0.8 * 2, 0.8 * -1, 1.1 * -1]
    assert loss.item() == pytest.approx(-sum(x * y for x, y in zip(wa, lp)) / 5, rel=1e-5)
    assert m["actor/pg_clipfrac"] == pytest.approx(3 / 5)  # 1.5, 0.5 (A>0) and 0.5 (A<0); not the padding
    loss.backward()
    # d/dlog pi = -w A / N, clipped or not
    assert logp.grad.tolist() == [pytest.approx([-0.48, -0.4, -0.32]), pytest.approx([0.16, 0.22, 0.0])]
    ppo_logp = logp.detach().clone().requires_grad_()
    ppo, _ = ppo_policy_loss(ppo_logp, old, adv, MASK, clip_ratio_c=None, loss_agg_mode="token-mean")
    ppo.backward()
    # PPO: -A r / N unclipped, 0 clipped: row 0 token 0 (1.5 > 1.2, A>0) and row 1 token 0 (0.5 < 0.8, A<0)
    # lose it; at r = 1 (row 0 token 1) and wherever r is inside the range (row 1 token 1) the two agree
    assert ppo_logp.grad.tolist() == [pytest.approx([0.0, -0.4, -0.2]), pytest.approx([0.0, 0.22, 0.0])]
    assert logp.grad[0, 1].item() == pytest.approx(ppo_logp.grad[0, 1].item())


def test_cispo_default_has_no_lower_bound():
    # the paper bounds the weight above only: low = 1 keeps r = 0.3 as the weight 0.3, r = 2 becomes 1.2
    logp = torch.log(t([0.3, 2.0])).requires_grad_()
    loss, _ = cispo_policy_loss(logp, torch.zeros(1, 2), t([1.0, 1.0]), torch.ones(1, 2))
    loss.backward()
    assert logp.grad.tolist()[0] == pytest.approx([-0.3 / 2, -1.2 / 2])


def test_gmpo_geometric_mean_with_sign_aware_clip_by_hand():
    # eps = 0.4 each side: the paper's clip(rho, e^-0.4, e^0.4) is a clip of the log-ratio to [-0.4, 0.4]
    # row 0, A = +1, log-ratios [0.1, 0.6, -0.7]: min(rho A, clip(rho) A) cuts 0.6 to 0.4 (grad 0), keeps -0.7
    # row 1, A = -2, log-ratios [-0.5, 0.5, pad 9]: max(rho, clip(rho)) cuts -0.5 to -0.4 (grad 0), keeps 0.5
    # row 2: no response token, not a sequence of the mean
    log_ratio = t([0.1, 0.6, -0.7], [-0.5, 0.5, 9.0], [1.0, 1.0, 1.0])
    old = torch.full((3, 3), -2.0)
    logp = (old + log_ratio).requires_grad_()
    adv = t([1.0, 1.0, 1.0], [-2.0, -2.0, -2.0], [5.0, 5.0, 5.0])
    mask = t([1, 1, 1], [1, 1, 0], [0, 0, 0])
    loss, m = gmpo_policy_loss(logp, old, adv, mask, clip_ratio_low=0.4, clip_ratio_high=0.4)
    s0 = (math.exp(0.1) * math.exp(0.4) * math.exp(-0.7)) ** (1 / 3)  # the clipped ratios' geometric mean
    s1 = (math.exp(-0.4) * math.exp(0.5)) ** (1 / 2)
    assert loss.item() == pytest.approx((-1 * s0 + 2 * s1) / 2, rel=1e-5)  # 2 sequences, not 3
    assert m["actor/pg_clipfrac"] == pytest.approx(1 / 5) and m["actor/pg_clipfrac_lower"] == pytest.approx(1 / 5)
    loss.backward()
    # d(-A s)/dlogp_t = -A s / |o| for an unclipped token, over 2 sequences
    g = logp.grad.tolist()
    assert g[0] == pytest.approx([-s0 / 6, 0.0, -s0 / 6], rel=1e-5)
    assert g[1] == pytest.approx([0.0, s1 / 2, 0.0], rel=1e-5)
    assert g[2] == [0.0, 0.0, 0.0]


def test_sapo_soft_gate_is_the_policy_gradient_at_one_and_damped_away():
    # tau_pos = 1 (row 0, A = +1), tau_neg = 2 (row 1, A = -1; distinct so a swapped gate shows)
    r = t([1.0, 1.5, 0.5], [1.0, 2.0, 1.0])
    logp = r.log().requires_grad_()
    adv = t([1.0, 1.0, 1.0], [-1.0, -1.0, -1.0])
    loss, m = sapo_policy_loss(logp, torch.zeros(2, 3), adv, MASK, tau_pos=1.0, tau_neg=2.0)
    # f(r) = 4/tau sigmoid(tau (r - 1)); loss_t = -f A; each sequence's token mean, then theirs
    row0 = -(4 * sig(0.0) + 4 * sig(0.5) + 4 * sig(-0.5)) / 3
    row1 = (2 * sig(0.0) + 2 * sig(2.0)) / 2
    assert loss.item() == pytest.approx((row0 + row1) / 2, rel=1e-5)
    loss.backward()

    # d loss_t / dlogp_t = -A f'(r) r / (|o| G) with f'(r) = 4 s (1 - s): the plain policy gradient -A r / (|o| G)
    # times the damping 4 s (1 - s), which is 1 at r = 1
    def damp(x):
        return 4 * sig(x) * (1 - sig(x))

    g = logp.grad.tolist()
    assert g[0][0] == pytest.approx(-1 / 6, rel=1e-5) and g[1][0] == pytest.approx(1 / 4, rel=1e-5)
    assert g[0][1:] == pytest.approx([-1.5 / 6 * damp(0.5), -0.5 / 6 * damp(-0.5)], rel=1e-5)
    assert g[1][1:] == pytest.approx([2.0 / 4 * damp(2.0), 0.0], rel=1e-5)
    gates = [1.0, damp(0.5), damp(-0.5), 1.0, damp(2.0)]
    assert m["actor/pg_gate_mean"] == pytest.approx(sum(gates) / 5, rel=1e-5)


# One batch for the covariance losses. A: +2 (row 0), -2 (row 1); mean over the 5 valid tokens 0.4, so
# A - mean A = 1.6 / -2.4. log pi = -2 + d with d summing to 0 over the valid tokens (mean log pi = -2); the
# padding carries A = +2 and log pi = 5, which would have the largest covariance were it counted.
COV_ADV = t([2.0, 2.0, 2.0], [-2.0, -2.0, 2.0])
COV_RATIO = t([1.1, 1.5, 1.0], [0.9, 0.5, 1.0])  # PPO (0.2) clips row 0 token 1 (A>0) and row 1 token 1 (A<0)


def cov_batch(d):
    logp = (-2 + t(*d)).requires_grad_()
    return logp, logp.detach() - COV_RATIO.log()


def test_clip_cov_cuts_the_one_candidate():
    # d = [1.5, -0.75, -0.25], [0.5, -1, pad]: covariance terms [2.4, -1.2, -0.4], [-1.2, 2.4]; in (1, 5):
    # row 0 token 0 and row 1 token 1, which PPO already clipped: one candidate, max(1, int(2e-4 * 5)) = 1 cut
    # (any seed: a pick of the PPO-clipped token would show in row 0 token 0's gradient)
    for seed in range(8):
        logp, old = cov_batch([[1.5, -0.75, -0.25], [0.5, -1.0, 7.0]])
        gen = torch.Generator().manual_seed(seed)
        loss, m = clip_cov_policy_loss(logp, old, COV_ADV, MASK, clip_cov_ratio=2e-4, generator=gen)
        loss.backward()
        assert logp.grad[0, 0].item() == 0.0
    # PPO per token [-2.2, -2.4 (clipped), -2], [1.8, 1.6 (clipped)]; the cut token's -2.2 goes
    assert loss.item() == pytest.approx((-2.4 - 2 + 1.8 + 1.6) / 5, rel=1e-5)
    assert m["actor/clip_cov_frac"] == pytest.approx(1 / 5) and m["actor/pg_clipfrac"] == pytest.approx(2 / 5)
    ppo_logp = logp.detach().clone().requires_grad_()
    ppo, _ = ppo_policy_loss(ppo_logp, old, COV_ADV, MASK, clip_ratio_c=None, loss_agg_mode="token-mean")
    ppo.backward()
    # PPO's -A r / N: [-0.44, 0, -0.4], [0.36, 0]; Clip-Cov the same but the cut token's
    assert ppo_logp.grad.tolist() == [pytest.approx([-0.44, 0.0, -0.4]), pytest.approx([0.36, 0.0, 0.0])]
    assert logp.grad.tolist() == [pytest.approx([0.0, 0.0, -0.4]), pytest.approx([0.36, 0.0, 0.0])]


def test_clip_cov_pick_follows_the_generator():
    # lb = -5: every token PPO did not clip is a candidate (row 0 tokens 0, 2; row 1 token 0); int(0.5 * 5) = 2
    def cut(seed):
        logp, old = cov_batch([[1.5, -0.75, -0.25], [0.5, -1.0, 7.0]])
        gen = torch.Generator().manual_seed(seed)
        loss, m = clip_cov_policy_loss(
            logp, old, COV_ADV, MASK, clip_cov_ratio=0.5, clip_cov_lb=-5.0, clip_cov_ub=5.0, generator=gen
        )
        loss.backward()
        assert m["actor/clip_cov_frac"] == pytest.approx(2 / 5)
        return {(i, j) for i, j in [(0, 0), (0, 2), (1, 0)] if logp.grad[i, j].item() == 0.0}

    for seed in range(4):
        assert len(cut(seed)) == 2 and cut(seed) == cut(seed)


def test_kl_cov_penalises_the_top_covariance_token():
    # d = [1.5, -0.75, -0.25], [0.75, -1.25, pad]: covariance terms [2.4, -1.2, -0.4], [-1.8, 3.0]; top 1 is
    # row 1 token 1 (r = 0.5) not the padding, whose 1.6 x 7 would top it
    logp, old = cov_batch([[1.5, -0.75, -0.25], [0.75, -1.25, 7.0]])
    loss, m = kl_cov_policy_loss(logp, old, COV_ADV, MASK, kl_cov_ratio=2e-4, ppo_kl_coef=0.5)
    # unclipped -A r: [-2.2, -3, -2], [1.8, 1]; plus 0.5 |ln 0.5| on the penalised one
    assert loss.item() == pytest.approx((-2.2 - 3 - 2 + 1.8 + 1 + 0.5 * math.log(2)) / 5, rel=1e-5)
    assert m["actor/kl_cov_frac"] == pytest.approx(1 / 5)
    loss.backward()
    # -A r / N everywhere; the penalised token adds coef * sign(log r) / N = 0.5 x -1 / 5
    assert logp.grad.tolist() == [pytest.approx([-0.44, -0.6, -0.4]), pytest.approx([0.36, 0.2 - 0.1, 0.0])]


def test_the_table_and_its_settings():
    assert POLICY_LOSS_FNS.keys() == POLICY_LOSSES.keys()
    assert set(POLICY_LOSSES) == {"ppo", "gspo", "cispo", "gmpo", "sapo", "clip_cov", "kl_cov"}
    got = {
        name: PolicyLossSettings(policy_loss=name)
        for name in ("ppo", "gspo", "cispo", "gmpo", "sapo", "clip_cov", "kl_cov")
    }
    assert (got["ppo"].clip_ratio_low, got["ppo"].clip_ratio_high, got["ppo"].loss_agg_mode) == (0.2, 0.2, "token-mean")
    assert (got["gspo"].clip_ratio_low, got["gspo"].clip_ratio_high) == (3e-4, 4e-4)
    assert (got["cispo"].clip_ratio_low, got["cispo"].clip_ratio_high, got["cispo"].loss_agg_mode) == (
        1.0,
        0.2,
        "token-mean",
    )
    assert (got["gmpo"].clip_ratio_low, got["gmpo"].clip_ratio_high) == (0.4, 0.4)
    assert (got["sapo"].tau_pos, got["sapo"].tau_neg, got["sapo"].clip_ratio_low) == (1.0, 1.05, None)
    assert (got["clip_cov"].clip_cov_ratio, got["clip_cov"].clip_cov_lb, got["clip_cov"].clip_cov_ub) == (2e-4, 1, 5)
    assert (got["kl_cov"].kl_cov_ratio, got["kl_cov"].ppo_kl_coef) == (2e-4, 0.1)
    for name in ("gspo", "gmpo", "sapo"):  # their objectives fix the aggregation
        assert got[name].loss_agg_mode == "seq-mean-token-mean"
        with pytest.raises(ValueError, match=f"loss_agg_mode.*must be seq-mean-token-mean.*{name}"):
            PolicyLossSettings(policy_loss=name, loss_agg_mode="token-mean")
    assert PolicyLossSettings(policy_loss="ppo", clip_ratio_high=0.28).clip_ratio_high == 0.28  # set beats default
    with pytest.raises(ValueError, match="tau_pos.*read by policy_loss sapo, not ppo"):
        PolicyLossSettings(policy_loss="ppo", tau_pos=1.0)
    with pytest.raises(ValueError, match="clip_ratio_low.*not sapo"):
        PolicyLossSettings(policy_loss="sapo", clip_ratio_low=0.2)


TOKEN = "token-mean"
DIRECT = {  # each loss called by hand with its paper's defaults
    "ppo": (
        ppo_policy_loss,
        dict(clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0, loss_agg_mode="token-mean"),
    ),
    "gspo": (gspo_policy_loss, dict(clip_ratio_low=3e-4, clip_ratio_high=4e-4)),
    "cispo": (cispo_policy_loss, dict(clip_ratio_low=1.0, clip_ratio_high=0.2, loss_agg_mode=TOKEN)),
    "gmpo": (gmpo_policy_loss, dict(clip_ratio_low=0.4, clip_ratio_high=0.4)),
    "sapo": (sapo_policy_loss, dict(tau_pos=1.0, tau_neg=1.05)),
    "clip_cov": (
        clip_cov_policy_loss,
        dict(clip_ratio_low=0.2, clip_ratio_high=0.2, clip_cov_ratio=2e-4, clip_cov_lb=1.0, clip_cov_ub=5.0),
    ),
    "kl_cov": (kl_cov_policy_loss, dict(kl_cov_ratio=2e-4, ppo_kl_coef=0.1, loss_agg_mode=TOKEN)),
}


@pytest.mark.parametrize("name", sorted(DIRECT))
def test_policy_loss_dispatches_with_the_resolved_defaults(name):
    gen = torch.Generator().manual_seed(1)
    old = -torch.rand(3, 4, generator=gen) * 3
    logp = old + (torch.rand(3, 4, generator=gen) - 0.5)
    adv = torch.randn(3, 4, generator=gen) * 2
    mask = t([1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0])
    w = torch.rand(3, 4, generator=gen) + 0.5
    args = (logp, old, adv, mask)
    got, got_m = policy_loss(
        PolicyLossSettings(policy_loss=name), *args, weights=w, generator=torch.Generator().manual_seed(7)
    )
    fn, settings = DIRECT[name]
    if name == "clip_cov":
        settings = {**settings, "generator": torch.Generator().manual_seed(7)}
    want, want_m = fn(*args, weights=w, **settings)
    assert got.item() == pytest.approx(want.item(), rel=1e-6) and got_m == pytest.approx(want_m)


def test_each_loss_reads_the_run_settings_its_signature_names():
    assert READS["ppo"] == ("clip_ratio_low", "clip_ratio_high", "clip_ratio_c", "loss_agg_mode")
    assert READS["sapo"] == ("tau_pos", "tau_neg")

    def renamed(logprobs, old_logprobs, advantages, response_mask, *, clip_low=0.2, weights=None):
        raise AssertionError

    assert reads(renamed) == ("clip_low",) and "clip_low" not in SETTINGS  # what the import-time check refuses
