"""On-policy distillation's per-token advantages (meshrl.algos.distill) by hand."""

import math

import pytest
import torch

from meshrl.algos.distill import distillation_advantages


def test_each_token_is_graded_by_the_teacher_against_the_sampler():
    teacher = torch.tensor([[-0.5, -2.0, -1.0], [-0.1, -0.2, -9.0]])
    student = torch.tensor([[-1.0, -1.0, -1.5], [-0.1, -0.7, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])  # the last token is padding
    adv, m = distillation_advantages(teacher, student, mask, coef=2.0)
    # 2 x (teacher - student): the teacher likes token 0 more (+), token 1 less (-); padding stays 0
    assert torch.allclose(adv, torch.tensor([[1.0, -2.0, 1.0], [0.0, 1.0, 0.0]]))
    # reverse KL estimate: mean of (student - teacher) over the 5 tokens = (-0.5 + 1 - 0.5 + 0 - 0.5) / 5
    assert m["distill/reverse_kl"] == pytest.approx(-0.5 / 5)
    assert m["distill/teacher_logprob"] == pytest.approx((-0.5 - 2.0 - 1.0 - 0.1 - 0.2) / 5)
    assert all(math.isfinite(v) for v in m.values())
