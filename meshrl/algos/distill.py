"""On-policy distillation's signal: the student samples, a teacher scores each sampled token, and the
per-token difference of their log-probs is the advantage (Agarwal et al. 2024, GKD, arXiv:2306.13649;
Thinking Machines' "On-Policy Distillation", 2025; verl's and slime's OPD).

A_t = coef * (log p_teacher(y_t) - log p_student(y_t)), the negative of the per-token reverse-KL estimate at
the token the student chose, with no discount: each token is graded on its own, densely, where a task reward
grades only the end. Minimizing the student's reverse KL to the teacher is mode seeking: it learns what the
teacher would do on the student's own states, the ones it reaches at test time."""

import torch

from meshrl.algos.masked import masked_mean


def distillation_advantages(
    teacher_logprobs: torch.Tensor, student_logprobs: torch.Tensor, response_mask: torch.Tensor, coef: float = 1.0
) -> tuple[torch.Tensor, dict[str, float]]:
    """(B, T) advantages, zero on padding, and metrics: distill/reverse_kl (the token mean of
    log p_student - log p_teacher, which falls as the student learns) and the teacher's mean log-prob.
    student_logprobs are the sampler's (the rollout's), the policy the tokens came from."""
    gap = (teacher_logprobs.float() - student_logprobs.float()) * response_mask
    return coef * gap, {
        "distill/reverse_kl": masked_mean(-gap, response_mask).item(),
        "distill/teacher_logprob": masked_mean(teacher_logprobs.float(), response_mask).item(),
    }
