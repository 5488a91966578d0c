"""What a step's samples are read as: the step's score metrics (critic/score/*, critic/acc/mean and what the
reward service reported) and the rows of the run's sample log (samples.jsonl).

    metrics = score_metrics(scored)                  # critic/score/mean, critic/acc/mean, reward/num_failed, ...
    rows = sample_rows(gen, scored, tokenizer, k)    # prompt as rendered, messages, response, score, extras
"""

import logging

from orchestrator.lifecycle.mesh import rendered_prompts

log = logging.getLogger(__name__)


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
