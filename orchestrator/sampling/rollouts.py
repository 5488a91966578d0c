"""One step's traffic with the rollout: its samples and its weight push, sampled ahead or not.

    rollouts = Rollouts(mesh, tokenizer, producer)          # the run loop makes one per step
    gen, scored = rollouts.sample_and_score(t, number, prompts)
    ...
    rollouts.push_weights(number)                           # actor -> rollout
    metrics.update(rollouts.metrics)                        # the run loop, after the step
    log the samples in rollouts.sampled

With trainer.max_staleness >= 1 a producer (pipeline) sampled the step ahead: sample_and_score takes its
batch from it, and push_weights lets it hold a push back until the steps due the older weights are
generated. With rollout.partial the run's carry (partial) samples the step in rounds, its batch joining
the prompts to start. Otherwise the step samples now and pushes at once. Either way the step reads the same.
"""

import dataclasses
from collections.abc import Callable

from meshrl.clients import Scores
from meshrl.dataproto import DataProto
from orchestrator.lifecycle.mesh import Mesh
from orchestrator.sampling.partial import Partial
from orchestrator.sampling.pipeline import Producer
from orchestrator.sampling.samples import sample, staleness_metrics
from orchestrator.timer import Timer


@dataclasses.dataclass
class Rollouts:
    mesh: Mesh
    tokenizer: object  # the actor's, for multi-turn observations
    producer: Producer | None = None  # trainer.max_staleness >= 1: the run's producer, sampling ahead
    # (Generate reply, Scores, the tokenizer that reads its prompts back) of the step's training samples:
    #   sample_rows' first arguments, for the sample log
    sampled: tuple[DataProto, Scores, object] | None = None
    metrics: dict = dataclasses.field(default_factory=dict)  # the producer's figures for the step
    more: Callable[[], tuple] | None = None  # the next batch's (indices, uids) from the run's sampler, for a
    #   step that samples further rounds (sampling.dynamic, partial); None while a producer draws the batches
    partial: Partial | None = None  # rollout.partial: the run's carry of unfinished samples
    batch: tuple = ()  # the step's (indices, uids): with partial, the prompts it adds to those to start

    def sample_and_score(self, t: Timer, number: int, prompts, round: int = 0) -> tuple[DataProto, Scores]:
        """The first two phases of every RL step: rollout.n responses per prompt (the step's seed), scored.
        With a producer they were done ahead: this waits for them (timing_s/wait_batch), and `metrics` gets
        their times and staleness. `round` > 0: a further round of the step (its own seed; no producer)."""
        if self.partial is not None:
            assert not round, "partial rollouts sample their own rounds"
            indices, uids = self.batch
            gen, scored, seconds, self.metrics = self.partial.sample(self.mesh, number, indices, uids, self.more)
            t.update(seconds)
        elif self.producer is not None:
            assert not round, "a producer samples one round a step"
            with t("wait_batch"):
                gen, scored, seconds, version = self.producer.take(number)
            self.metrics = {**seconds, **staleness_metrics(number, version)}
        else:
            gen, scored, seconds = sample(self.mesh, self.tokenizer, number, prompts, round=round)
            for k, v in seconds.items():  # rounds add up
                t[k] = t.get(k, 0.0) + v
        self.sampled = (gen, scored, self.tokenizer)
        return gen, scored

    def push_weights(self, version: int) -> float:
        """The actor's weights to the rollout as `version` (Mesh.push_weights); seconds it took. Sampling
        ahead, steps due the older weights are generated first."""
        if self.producer is not None:
            self.producer.before_push(version)
        seconds = self.mesh.push_weights(version=version)
        if self.producer is not None:
            self.producer.after_push(version)
        return seconds
