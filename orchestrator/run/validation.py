"""Held-out validation: greedy answers to every held-out prompt (and k sampled ones), as the run loop
runs it at step 0, every trainer.val_every steps and at the last step; one "validate" span (a trace of
its own, which `meshrl trace --step N` shows beside the step's).

    metrics, correct = validate(cfg, mesh, tokenizer, val, step=number)
"""

import torch

from meshrl import telemetry
from orchestrator.config import Config
from orchestrator.data import PromptDataset
from orchestrator.lifecycle.mesh import Mesh
from orchestrator.output.report import standard_error
from orchestrator.sampling.rollouts import batch_sampler


def answers(mesh: Mesh, tokenizer, prompts, seed: int = 0, n: int | None = None, greedy: bool = False):
    """Scores of n answers to each prompt (greedy: one), graded by the reward service alone (not a judge)."""
    sample = batch_sampler(mesh.cfg, validating=True)
    return sample(mesh, prompts, seed, tokenizer, n=n, greedy=greedy, judged=False).scored


def validate(
    cfg: Config, mesh: Mesh, tokenizer, data: PromptDataset, step: int | None = None
) -> tuple[dict[str, float], list[bool] | None]:
    """Greedy answers to every held-out prompt (val/acc/mean with its standard error val/acc/se,
    val/score/mean); with trainer.val_k > 1 also k sampled answers each: val/acc/mean@k (mean over samples)
    and val/acc/best@k (any right). Also each prompt's greedy answer right or not (None: no `acc` column),
    which the run log keeps so a gain can be measured problem by problem (orchestrator.output.report).
    `step`: the step validated, on the span (without it `meshrl trace` places the span by time)."""
    with telemetry.span("validate", step=step, prompts=len(data)):
        return _validate(cfg, mesh, tokenizer, data)


def _validate(cfg: Config, mesh: Mesh, tokenizer, data: PromptDataset) -> tuple[dict[str, float], list[bool] | None]:
    rows = list(range(len(data)))
    size = max(1, cfg.data.val_batch_size)
    out, greedy, sampled = {}, [], []
    for start in range(0, len(rows), size):
        part = rows[start : start + size]
        prompts = data.batch(part, [f"val-{i}" for i in part])
        greedy.append(answers(mesh, tokenizer, prompts, greedy=True))
        if cfg.trainer.val_k > 1:
            sampled.append(answers(mesh, tokenizer, prompts, seed=cfg.trainer.seed + 7, n=cfg.trainer.val_k))
    out["val/score/mean"] = torch.cat([s.scores for s in greedy]).mean().item()
    correct = None
    if any(s.columns.get("acc") is not None for s in greedy):  # an episode cut short reports none: wrong
        correct = [bool(x) for s in greedy for x in s.columns.get("acc", [False] * len(s.scores))]
        p = sum(correct) / len(correct)
        out["val/acc/mean"], out["val/acc/se"] = p, standard_error(p, len(correct))
    if sampled:
        k = cfg.trainer.val_k
        scores = torch.cat([s.scores for s in sampled]).view(-1, k)  # rows come back prompt by prompt
        out[f"val/score/mean@{k}"] = scores.mean().item()
        if any(s.columns.get("acc") is not None for s in sampled):
            acc = torch.tensor(
                [bool(x) for s in sampled for x in s.columns.get("acc", [False] * len(s.scores))], dtype=torch.float
            ).view(-1, k)
            out[f"val/acc/mean@{k}"] = acc.mean().item()
            out[f"val/acc/best@{k}"] = acc.max(-1).values.mean().item()
    return out, correct
