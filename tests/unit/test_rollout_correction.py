"""Rollout correction beyond truncated token/sequence weights (meshrl.algos.rollout_correction), by hand:
the geometric-mean weight, IcePop's two-sided mask, verl's rejection options and their thresholds."""

import math

import pytest
import torch

from meshrl.algos.rollout_correction import rollout_is_weights, rollout_rejection_mask
from meshrl.config.checked import FieldError
from meshrl.config.losses import PPOParams, rs_thresholds


def t(*rows):
    return torch.tensor(rows, dtype=torch.float32)


OLD = t([-1.0, -2.0, -0.5], [-1.0, -1.0, 0.0])
MASK = t([1, 1, 1], [1, 1, 0])
RATIOS = t([1.5, 3.0, 0.5], [0.25, 1.2, 10.0])  # old / rollout per token; the 10 is padding
ROLLOUT = OLD - torch.log(RATIOS)


def test_the_geometric_weight_is_the_mean_log_ratio_of_each_response():
    w, m = rollout_is_weights(OLD, ROLLOUT, MASK, "geometric", 2.0)
    # row 0: (1.5 * 3 * 0.5)^(1/3) = 2.25^(1/3) = 1.3104; row 1: (0.25 * 1.2)^(1/2) = 0.3^(1/2) = 0.5477
    assert torch.allclose(w, t([2.25 ** (1 / 3)] * 3, [0.3**0.5] * 3), atol=1e-6)
    assert m["actor/rollout_is_capped_frac"] == 0.0
    assert m["actor/rollout_is_mean"] == pytest.approx((3 * 2.25 ** (1 / 3) + 2 * 0.3**0.5) / 5, rel=1e-6)


def test_mask_mode_zeroes_the_weights_outside_the_band_instead_of_cutting_them():
    w, m = rollout_is_weights(OLD, ROLLOUT, MASK, "token", 2.0, mode="mask", floor=0.45)
    # kept: 1.5, 0.5, 1.2; out: 3 (above 2), 0.25 (below 0.45)
    assert torch.allclose(w[0], t(1.5, 0.0, 0.5)) and torch.allclose(w[1, :2], t(0.0, 1.2))
    assert m["actor/rollout_is_masked_frac"] == pytest.approx(2 / 5)
    seq, m = rollout_is_weights(OLD, ROLLOUT, MASK, "sequence", 2.0, mode="mask", floor=0.45)  # 2.25, 0.3: out
    assert torch.equal(seq, torch.zeros(2, 3)) and m["actor/rollout_is_masked_frac"] == 1.0


def test_token_rejection_by_each_estimate():
    # k1 = -log r: ln(1/1.5) = -0.405, ln(1/3) = -1.099, ln 2 = 0.693 | ln 4 = 1.386, ln(1/1.2) = -0.182
    keep, m = rollout_rejection_mask(OLD, ROLLOUT, MASK, "token_k1", "2.1")  # -log r in [-0.742, 0.742]
    assert torch.equal(keep, t([1, 0, 1], [0, 1, 0]))  # 3 and 0.25 out; padding is never kept
    assert m["actor/rollout_rs_masked_frac"] == pytest.approx(2 / 5)
    assert m["actor/rollout_rs_seq_masked_frac"] == 1.0  # each response lost a token
    # k2 = 0.5 (ln r)^2: 0.082, 0.603, 0.240 | 0.961, 0.017 -> <= 0.5 keeps 1.5, 0.5, 1.2
    keep, _ = rollout_rejection_mask(OLD, ROLLOUT, MASK, "token_k2", "0.5")
    assert torch.equal(keep, t([1, 0, 1], [0, 1, 0]))
    # k3 = r - 1 - ln r: 0.095, 0.901, 0.193 | 0.636, 0.018 -> <= 0.2 keeps 1.5, 0.5, 1.2
    keep, _ = rollout_rejection_mask(OLD, ROLLOUT, MASK, "token_k3", "0.2")
    assert torch.equal(keep, t([1, 0, 1], [0, 1, 0]))


def test_sequence_rejection_keeps_or_drops_a_whole_response():
    k3 = RATIOS - 1 - torch.log(RATIOS)
    row0 = k3[0].tolist()  # 0.0945, 0.9014, 0.1931
    row1 = k3[1, :2].tolist()  # 0.6363, 0.0177
    # seq_max_k3 <= 0.7: row 0's max 0.90 is out, row 1's 0.64 is in
    keep, m = rollout_rejection_mask(OLD, ROLLOUT, MASK, "seq_max_k3", "0.7")
    assert max(row0) > 0.7 > max(row1)
    assert torch.equal(keep, t([0, 0, 0], [1, 1, 0])) and m["actor/rollout_rs_seq_masked_frac"] == 0.5
    # seq_mean_k3 <= 0.4: means 0.396 and 0.327, both in; seq_sum_k3 <= 1.0: sums 1.189 and 0.654
    keep, _ = rollout_rejection_mask(OLD, ROLLOUT, MASK, "seq_mean_k3", "0.4")
    assert sum(row0) / 3 < 0.4 and torch.equal(keep, MASK)
    keep, _ = rollout_rejection_mask(OLD, ROLLOUT, MASK, "seq_sum_k3", "1.0")
    assert sum(row0) > 1.0 > sum(row1) and torch.equal(keep, t([0, 0, 0], [1, 1, 0]))
    # seq_sum_k1 = -sum log r: -ln 2.25 = -0.811 | -ln 0.3 = 1.204; in [ln 0.5, ln 2] = [-0.693, 0.693]: neither
    keep, _ = rollout_rejection_mask(OLD, ROLLOUT, MASK, "seq_sum_k1", "2")
    assert torch.equal(keep, torch.zeros(2, 3))
    # two options at once, one threshold each: both must pass
    keep, _ = rollout_rejection_mask(OLD, ROLLOUT, MASK, "token_k1,seq_max_k3", "2.1,0.7")
    assert torch.equal(keep, t([0, 0, 0], [0, 1, 0]))


def test_thresholds_read_as_verl_writes_them():
    assert rs_thresholds("token_k1", "2") == {"token_k1": (0.5, 2.0)}
    assert rs_thresholds("token_k1,seq_mean_k3", "0.9_1.1,0.01") == {
        "token_k1": (0.9, 1.1),
        "seq_mean_k3": (0.0, 0.01),
    }
    for options, spec, match in [
        ("seq_max_k1", "2", "not known"),
        ("token_k3", "0.1_0.2", "one upper bound"),
        ("token_k1", "2_1", "lower <= upper"),
        ("token_k1,token_k2", "1,2,3", "3 thresholds for 2 options"),
    ]:
        with pytest.raises(ValueError, match=match):
            rs_thresholds(options, spec)
    with pytest.raises(FieldError, match=r"rollout_rs=token_k9 does not fit"):
        PPOParams(rollout_rs="token_k9", rollout_rs_threshold="2")
    with pytest.raises(FieldError, match=r"rollout_is_floor=0.5 bounds the weights only with rollout_is_mode=mask"):
        PPOParams(rollout_is="token", rollout_is_floor=0.5)
    assert PPOParams(rollout_rs="token_k1", rollout_rs_threshold="2").corrects
    assert math.isclose(rs_thresholds("seq_sum_k1", "4")["seq_sum_k1"][0], 0.25)
