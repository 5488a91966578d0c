"""What every way of sampling a batch gives back, the plainest way (one Generate call), and the seeds and
staleness every way shares.

    gen, scored, seconds = one_call(mesh, prompts, seed)     # rollout.n answers per prompt, scored

Each way (this one; chunks; multi_turn's and agents' episodes) is a function of the same form,

    sample(mesh, prompts, seed, tokenizer=None, *, n=None, greedy=False, judged=True, on_generated=None)

n answers per prompt (None: rollout.n; greedy: 1), scored by the reward service and (judged) the judge,
on_generated() called once the rollout's part is done; rollouts.batch_sampler picks the run's.
"""

from typing import NamedTuple

from meshrl import seeds
from meshrl.clients.reward import Scores
from meshrl.dataproto import DataProto
from orchestrator.timer import Timer


class Sampled(NamedTuple):
    gen: DataProto  # verl's layout: prompts, responses, their masks and log-probs, the rows' columns
    scored: Scores
    seconds: dict[str, float]  # timing_s/gen (the rollout's part), timing_s/reward (what scoring added)


def per_prompt(cfg, n: int | None, greedy: bool) -> int:
    """Answers a sampler makes to each prompt: n, else 1 greedy, else rollout.n."""
    return n or (1 if greedy else cfg.rollout.n)


def sampling_seed(cfg, number: int, round: int = 0) -> int:
    """Step `number` samples with its own seed, so a resumed run samples what an uninterrupted one would."""
    return seeds.step_seed(cfg.trainer.seed, number, round)


def staleness_metrics(number: int, version: int) -> dict[str, float]:
    """async/weight_version and async/staleness of step `number`'s samples, `version` their oldest weights."""
    return {"async/weight_version": float(version), "async/staleness": float(number - 1 - version)}


def one_call(
    mesh, prompts: DataProto, seed: int, tokenizer=None, *, n=None, greedy=False, judged=True, on_generated=None
) -> Sampled:
    """One Generate call for all of `prompts`, then one Score. `tokenizer`: unused (the form's)."""
    t = Timer()
    with t("gen"):
        gen = mesh.generate(prompts, seed=seed, n=n, greedy=greedy)
    if on_generated is not None:
        on_generated()
    with t("reward"):
        scored = mesh.score(gen, judged=judged)
    return Sampled(gen, scored, dict(t))
