"""How a step gets its samples: when (one protocol, StepSampler), how a batch is sampled (batch_sampler,
one dispatch), and one step's traffic with the rollout (Rollouts).

    rollouts = Rollouts(mesh, tokenizer, sampler, more)     # the run loop makes one per step
    gen, scored = rollouts.sample_and_score(t, number, indices, uids)
    ...
    rollouts.push_weights(number)                           # actor -> rollout
    metrics.update(rollouts.metrics)                        # the run loop, after the step
    log the samples in rollouts.sampled

A step sampler says when a step's batch is sampled: Now (when the step is done), pipeline.Ahead
(trainer.max_staleness >= 1: a producer sampled it ahead, and holds a push back until the steps due the
older weights are generated), partial.Partial (rollout.partial: rounds that carry unfinished samples into
the next step); dynamic.Dynamic (DAPO's dynamic sampling) wraps Now. The run state picks one
(run.state.RunState.step_sampler), and each declares what it cannot be combined with (`refuses`, read by
sampling.combinations). Either way the step reads the same.
"""

import dataclasses
from collections.abc import Callable
from typing import ClassVar

from meshrl.clients import Scores
from meshrl.dataproto import DataProto
from orchestrator.data import PromptDataset
from orchestrator.lifecycle.mesh import Mesh
from orchestrator.sampling import agents, chunks, multi_turn
from orchestrator.sampling.sampled import Sampled, one_call, sampling_seed
from orchestrator.timer import Timer

# a step's (gen, scored, timing_s/* spent in the step, the sampler's own metrics)
StepSamples = tuple[DataProto, Scores, dict[str, float], dict[str, float]]
Draw = Callable[[], tuple]  # the run's sampler: the next batch's (indices, uids)


def batch_sampler(cfg, validating: bool = False) -> Callable[..., Sampled]:
    """The way the run samples a batch (sampling.sampled's form): one Generate call, rollout.chunks
    concurrent calls, the environment service's episodes or an agent's. Validation sends its batches in
    one call each, as it always has: its greedy answers then never depend on how rollout.chunks cut them."""
    r = cfg.rollout
    if r.multi_turn:  # episodes in the environment service
        return multi_turn.sample
    if r.agent or r.agent_command:  # an agent's episodes through the endpoint
        return agents.sample
    return chunks.sample if r.chunks > 1 and not validating else one_call


class StepSampler:
    """When a step's samples are made. `refuses`: {another way (sampling.combinations): the message
    refusing it, with {key} this way's setting, {other} the other's, {cfg} and {algorithm}}."""

    refuses: ClassVar[dict[str, str]] = {}

    def sample(self, mesh: Mesh, number: int, indices: list[int], uids: list[str], more: Draw | None) -> StepSamples:
        """Step `number`'s samples of the prompts (indices, uids); `more`: further batches from the run's
        sampler (None while a producer draws them)."""
        raise NotImplementedError

    def again(self, mesh: Mesh, number: int, round: int, more: Draw | None) -> StepSamples | None:
        """A further round of the step on the next batch (dynamic sampling); None where there is none."""
        return None

    def before_push(self, version: int) -> None:
        """The step is about to push `version` to the rollout."""

    def after_push(self, version: int) -> None:
        """The rollout holds `version`."""


@dataclasses.dataclass
class Now(StepSampler):
    """The step samples its batch when it is done (the default), each round with its own seed."""

    tokenizer: object  # the actor's: episodes' observations
    data: PromptDataset  # the run's training prompts

    def sample(self, mesh, number, indices, uids, more, round: int = 0) -> StepSamples:
        seed = sampling_seed(mesh.cfg, number, round)
        got = batch_sampler(mesh.cfg)(mesh, self.data.batch(indices, uids), seed, self.tokenizer)
        return got.gen, got.scored, got.seconds, {}

    def again(self, mesh, number, round, more):
        if more is None:
            return None
        indices, uids = more()
        return self.sample(mesh, number, indices, uids, more, round=round)


@dataclasses.dataclass
class Rollouts:
    mesh: Mesh
    tokenizer: object  # the actor's, for the sample log
    sampler: StepSampler  # when the step samples (run.state.RunState.step_sampler)
    more: Draw | None = None  # the run's sampler, for a step that samples further batches (dynamic
    #   sampling, partial rollouts); None while a producer draws the batches
    # (gen, scored, tokenizer) of the step's training samples: the sample log's (output.readings.sample_rows)
    sampled: tuple[DataProto, Scores, object] | None = None
    metrics: dict = dataclasses.field(default_factory=dict)  # the sampler's figures for the step

    def sample_and_score(self, t: Timer, number: int, indices: list[int], uids: list[str]) -> tuple[DataProto, Scores]:
        """The first two phases of every RL step: rollout.n responses per prompt (the step's seed), scored."""
        gen, scored, seconds, self.metrics = self.sampler.sample(self.mesh, number, indices, uids, self.more)
        for k, v in seconds.items():  # added to what the step's clock holds (Dynamic sums its own rounds)
            t[k] = t.get(k, 0.0) + v
        self.sampled = (gen, scored, self.tokenizer)
        return gen, scored

    def push_weights(self, version: int) -> float:
        """The actor's weights to the rollout as `version` (Mesh.push_weights); seconds it took."""
        self.sampler.before_push(version)
        seconds = self.mesh.push_weights(version=version)
        self.sampler.after_push(version)
        return seconds
