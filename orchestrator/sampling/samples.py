"""Which way a batch is sampled (one dispatch), and what a step's samples are read as.

    got = batch_sampler(cfg)(mesh, prompts, seed, tokenizer)       # rollout.n per prompt, scored
    metrics = score_metrics(scored)                                # critic/score/mean, critic/acc/mean, ...
    rows = sample_rows(gen, scored, tokenizer, k)                  # prompt as rendered, messages, response, ...

One Generate call (sampled.one_call), rollout.chunks concurrent calls (chunks), multi-turn episodes
(multi_turn) or an agent's episodes (agents), as the config says; each step samples with its own seed, so
a resumed run samples what an uninterrupted one would.
"""

import logging
from collections.abc import Callable

from meshrl import seeds
from orchestrator.config import Config
from orchestrator.lifecycle.mesh import Mesh, rendered_prompts
from orchestrator.sampling import agents, chunks, multi_turn
from orchestrator.sampling.sampled import Sampled, one_call

log = logging.getLogger(__name__)


def batch_sampler(cfg: Config, validating: bool = False) -> Callable[..., Sampled]:
    """The way the run samples a batch (sampling.sampled's form). Validation sends its batches in one
    call each, as it always has: its greedy answers then never depend on how rollout.chunks cut them."""
    r = cfg.rollout
    if r.multi_turn:  # episodes in the environment service
        return multi_turn.sample
    if r.agent or r.agent_command:  # an agent's episodes through the endpoint
        return agents.sample
    return chunks.sample if r.chunks > 1 and not validating else one_call


def sampling_seed(cfg: Config, number: int, round: int = 0) -> int:
    """Step `number` samples with its own seed, so a resumed run samples what an uninterrupted one would."""
    return seeds.step_seed(cfg.trainer.seed, number, round)


def staleness_metrics(number: int, version: int) -> dict[str, float]:
    """async/weight_version and async/staleness of step `number`'s samples, `version` their oldest weights."""
    return {"async/weight_version": float(version), "async/staleness": float(number - 1 - version)}


def answers(mesh: Mesh, tokenizer, prompts, seed: int = 0, n: int | None = None, greedy: bool = False):
    """Scores of n answers to each prompt (greedy: one), graded by the reward service alone (not a judge)."""
    sample = batch_sampler(mesh.cfg, validating=True)
    return sample(mesh, prompts, seed, tokenizer, n=n, greedy=greedy, judged=False).scored


def accuracy(scored) -> float | None:
    acc = scored.columns.get("acc")
    return None if acc is None else float(sum(bool(x) for x in acc) / len(scored.scores))


def score_metrics(scored) -> dict[str, float]:
    """critic/score/{mean,max,min}, critic/acc/mean, and what the reward service reported: reward/num_failed
    (warned about when not 0: those samples got reward.error_score), reward/<extra>/mean, ..."""
    s = scored.scores
    out = {
        "critic/score/mean": s.mean().item(),
        "critic/score/max": s.max().item(),
        "critic/score/min": s.min().item(),
        **{k: float(v) for k, v in scored.metrics.items()},
    }
    acc = accuracy(scored)
    if acc is not None:
        out["critic/acc/mean"] = acc
    failed = int(out.get("reward/num_failed", 0))
    if failed:
        errors = [e for e in scored.columns.get("reward_error", []) if e]
        log.warning(
            "%d of %d samples failed to score and got the error score%s",
            failed,
            len(s),
            f"; first error: {errors[0]}" if errors else "",
        )
    return out


def sample_rows(gen, scored, tokenizer, k: int) -> list[dict]:
    """The first k samples of a step as the run's sample log keeps them: the prompt as the model saw it
    (rendered by the chat template: system prompt, tools, generation prompt), the original `messages`,
    the response, score, ground truth, and the scorer's per-sample extras (acc, pred, reward_status, ...)."""
    cols = gen.non_tensor_batch
    k = min(k, len(scored.scores))
    prompts = rendered_prompts(gen, tokenizer, k)
    rows = []
    for i in range(k):
        row = {"prompt": prompts[i]}
        if "prompt" in cols:
            row["messages"] = cols["prompt"][i]
        row.update({"response": cols["response_text"][i], "score": round(scored.scores[i].item(), 6)})
        truth = (cols["reward_model"][i] or {}).get("ground_truth") if "reward_model" in cols else None
        if truth is not None:
            row["ground_truth"] = truth
        row.update(
            {key: values[i] for key, values in scored.columns.items() if not (key == "reward_error" and not values[i])}
        )
        rows.append(row)
    return rows
