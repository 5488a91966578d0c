"""algorithm.dynamic_sampling: DAPO's dynamic sampling (meshrl.algos.filtering) around a step's samples.

    sampler = Dynamic(Now(tokenizer, data))        # the run state's, in place of Now
    gen, scored, seconds, metrics = sampler.sample(mesh, number, indices, uids, more)

The step's first round is what the rollout sampled for its batch. Groups whose samples all have the same
algorithm.dynamic_sampling_metric (acc or score) are dropped, and further rounds of
data.train_batch_size prompts (the run's sampler, in order; each round its own seed) are sampled until
`groups` varied groups are kept or algorithm.max_sample_rounds rounds were sampled. Kept groups are
trained in the order they came, the surplus of the last round left out. A step that keeps fewer trains
on those; one that keeps none trains on its last round as it is (its advantages are zero). Metrics:
dynamic_sampling/{rounds, kept_groups, dropped_groups, samples_per_kept}.
"""

import dataclasses
import logging

from meshrl.algos.filtering import rows_of, varied_groups
from meshrl.clients.reward import Scores
from meshrl.dataproto import DataProto
from orchestrator.lifecycle.fleet import join_generations
from orchestrator.sampling.rollouts import Now, StepSampler, StepSamples

log = logging.getLogger(__name__)
METRICS = ("acc", "score")


def values(scored: Scores, metric: str) -> list[float]:
    """What a group must vary in: the scorer's acc column, or the scores."""
    if metric == "score":
        return scored.scores.tolist()
    if "acc" not in scored.columns:
        raise ValueError("algorithm.dynamic_sampling_metric=acc, but the scorer reports no acc: set it to score")
    return [float(bool(a)) for a in scored.columns["acc"]]


@dataclasses.dataclass
class Dynamic(StepSampler):
    """Now's rounds until the step has its varied groups (the module's docstring)."""

    now: Now

    def sample(self, mesh, number, indices, uids, more) -> StepSamples:
        a = mesh.cfg.algorithm
        gen, scored, seconds, _ = self.now.sample(mesh, number, indices, uids, more)
        gens: list[DataProto] = []
        scores: list[Scores] = []
        kept = dropped = 0
        generated, rounds, groups = len(gen), 1, len(indices)
        while True:
            uids = list(gen.non_tensor_batch["uid"])
            varied = varied_groups(uids, values(scored, a.dynamic_sampling_metric))
            dropped += len(dict.fromkeys(uids)) - len(varied)
            take = varied[: groups - kept]
            kept += len(take)
            if take:
                rows = rows_of(uids, take)
                gens.append(gen.select_idxs(rows))
                scores.append(scored.select(rows))
            further = (
                None if kept >= groups or rounds >= a.max_sample_rounds else self.now.again(mesh, number, rounds, more)
            )
            if further is None:
                break
            gen, scored, more_seconds, _ = further
            seconds = {k: seconds.get(k, 0.0) + v for k, v in more_seconds.items()}  # rounds add up
            generated += len(gen)
            rounds += 1
        if kept < groups:
            log.warning(
                "step %d: %d of %d groups vary in %s after %d sampling rounds (algorithm.max_sample_rounds)%s",
                number,
                kept,
                groups,
                a.dynamic_sampling_metric,
                rounds,
                "; training on the last round as it is" if not kept else "; training on those",
            )
        if gens:
            gen = join_generations(gens)
            scored = Scores.join(scores, gen.batch["responses"].shape[1])
        metrics = {
            "dynamic_sampling/rounds": float(rounds),
            "dynamic_sampling/kept_groups": float(kept),
            "dynamic_sampling/dropped_groups": float(dropped),
            "dynamic_sampling/samples_per_kept": generated / len(gen) if kept else float(generated),
        }
        return gen, scored, seconds, metrics
