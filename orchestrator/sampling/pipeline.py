"""trainer.max_staleness=K >= 1: a producer thread samples and scores the batches of the next K steps while
the actor trains on this one, so the rollout and the actor work at the same time.

Which weights sample step s (deterministic, the default): version

    v(s) = max(c(s), s - 1 - K)

where c(s) is the last checkpoint step before s (0 at the start). The producer waits for v(s) to be in
the rollout before it asks for s, and the push of version j is held back (rollouts.Rollouts.push_weights)
until every step sampled from j - 1 has been generated. Every batch is then sampled from the same weights in every run,
and a run resumed from a checkpoint at c samples what an uninterrupted one does: after a checkpoint the
steps go back to c's weights (which the checkpoint holds), at the cost of one step without overlap per
checkpoint. With trainer.deterministic=false the push is never held back: a batch is sampled from the
newest weights the rollout has, never older than s - 1 - K. The run loop owns the producer
(run.state.RunState): it starts it, hands it to each step's Rollouts, and stops it.

Staleness (s - 1 - the version that sampled s) is at most K by construction: the producer never asks
for s before version s - 1 - K is in the rollout, and the rollout loads a push only between generations,
or with rollout.on_update=keep between the steps of one (newer weights for the tokens after it; the batch's
version is its oldest, which staleness counts from).
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from collections.abc import Callable
from typing import ClassVar

from meshrl.clients import Scores
from meshrl.dataproto import DataProto
from orchestrator.sampling.rollouts import StepSampler, StepSamples, batch_sampler
from orchestrator.sampling.sampled import sampling_seed, staleness_metrics
from orchestrator.timer import Timer

Sampled = tuple[DataProto, Scores, dict[str, float], int]  # a step's (gen, scored, seconds by phase, version)


def start(cfg, mesh, tokenizer, data, sampler, first: int) -> Producer:
    """A producer for trainer.max_staleness from step `first` on: it draws the batches from `sampler`
    and samples them through `mesh` (rollouts.batch_sampler)."""

    def draw() -> tuple:
        indices, uids = sampler.next()
        return indices, uids, data.batch(indices, uids), sampler.state_dict()

    def sample(number: int, prompts, on_generated: Callable[[int], None]) -> tuple:
        seed, generated = sampling_seed(cfg, number), functools.partial(on_generated, number)
        return batch_sampler(cfg)(mesh, prompts, seed, tokenizer, on_generated=generated)

    t = cfg.trainer
    return Producer(
        sample,
        draw,
        first=first,
        last=t.total_steps,
        staleness=t.max_staleness,
        save_every=t.save_every,
        deterministic=t.deterministic,
    )


def version_for(step: int, staleness: int, save_every: int) -> int:
    """v(s) above: the weight version that samples step `step` (the run's last step is a checkpoint too,
    but no step comes after it)."""
    last_checkpoint = (step - 1) // save_every * save_every if save_every > 0 else 0
    return max(last_checkpoint, step - 1 - staleness)


class Producer:
    """Samples steps first.. in order, each once its weights are in the rollout; the steps take them.

    sample(number, prompts, on_generated) -> (gen, scored, seconds by phase) does one step's generation
    (calling on_generated(number) once it returns) and scoring; draw() -> (indices, uids, prompts, the
    sampler's state after the draw) is the next step's batch, drawn here in step order. Each step calls
    take(number), and before_push(version) / after_push(version) around its weight push (through its
    Rollouts); the run loop calls stop() at the end or on a failure, and records sampler_state(number) in
    a checkpoint at `number`.
    """

    def __init__(
        self,
        sample: Callable,
        draw: Callable[[], tuple],
        *,
        first: int,
        last: int,
        staleness: int,
        save_every: int,
        deterministic: bool = True,
    ):
        self.sample, self.draw = sample, draw
        self.batches: dict[int, tuple] = {}  # step -> (indices, uids)
        self.states: dict[int, dict] = {}  # step -> the sampler's state after drawing it
        self.first, self.last, self.k = first, last, staleness
        self.save_every, self.deterministic = save_every, deterministic
        self.cond = threading.Condition()
        self.pushed = first - 1  # the version in the rollout (the run's weights at the first step)
        self.generated = first - 1  # the last step whose generation has returned
        self.done: dict[int, Sampled | BaseException] = {}  # step -> its samples, or what stopped them
        self.stopping = False
        self.thread = threading.Thread(target=self._run, name="meshrl-producer", daemon=True)
        self.thread.start()

    # ---- the steps' side ------------------------------------------------------------------

    def take(self, number: int) -> Sampled:
        """Step `number`'s (gen, scored, seconds by phase, weight version); waits for it. A failure of its
        sampling is raised here."""
        with self.cond:
            self.cond.wait_for(lambda: number in self.done or self.stopping)
            if number not in self.done:
                raise RuntimeError("the producer stopped")
            out = self.done.pop(number)
        if isinstance(out, BaseException):
            raise out
        return out

    def batch(self, number: int) -> tuple:
        """Step `number`'s (indices, uids), once drawn."""
        with self.cond:
            self.cond.wait_for(lambda: number in self.batches or self.stopping or number in self.done)
        if number not in self.batches:
            self.take(number)  # raises what stopped the producer
        return self.batches[number]

    def sampler_state(self, number: int) -> dict:
        return self.states[number]

    def before_push(self, version: int) -> None:
        """Deterministic: hold version `version` back until every step sampled from the one before it has
        been generated (the rollout then never samples them from the new one)."""
        if not self.deterministic:
            return
        needed = [s for s in range(version + 1, min(self.last, version + self.k) + 1) if self.version(s) <= version - 1]
        if needed:
            with self.cond:
                self.cond.wait_for(lambda: self.generated >= max(needed) or self.stopping)

    def after_push(self, version: int) -> None:
        with self.cond:
            self.pushed = version
            self.cond.notify_all()

    def stop(self, wait: float = 600) -> None:
        """Stop sampling ahead; wait up to `wait` seconds for the thread (a call in flight ends with its
        service, or by its deadline)."""
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        self.thread.join(timeout=wait)

    # ---- the producer's side -------------------------------------------------------------

    def version(self, step: int) -> int:
        """The weights that sample `step`, never older than the run's at its first step."""
        rule = version_for(step, self.k, self.save_every) if self.deterministic else step - 1 - self.k
        return max(rule, self.first - 1)

    def _run(self) -> None:
        for step in range(self.first, self.last + 1):
            with self.cond:  # once its weights are in the rollout: so never more than K steps ahead
                self.cond.wait_for(lambda: self.stopping or self.pushed >= self.version(step))  # noqa: B023 - called at once, in the loop
                if self.stopping:
                    return
            out: Sampled | BaseException
            try:
                start = time.perf_counter()
                indices, uids, prompts, state = self.draw()
                self.batches[step], self.states[step] = (indices, uids), state
                gen, scored, seconds = self.sample(step, prompts, self._generated)
                seconds["timing_s/sample_wall"] = time.perf_counter() - start
                out = (gen, scored, seconds, int(gen.meta_info.get("weight_version", -1)))
            except BaseException as e:  # the step raises it at take(); nothing more is sampled
                out = e
            with self.cond:
                self.done[step] = out
                self.generated = max(self.generated, step)
                self.cond.notify_all()
                if isinstance(out, BaseException):
                    return

    def _generated(self, step: int) -> None:
        with self.cond:
            self.generated = max(self.generated, step)
            self.cond.notify_all()


SYNCHRONOUS = "{key}={cfg.trainer.max_staleness} samples ahead for {loops}; {algorithm} runs synchronously: set it to 0"


@dataclasses.dataclass
class Ahead(StepSampler):
    """trainer.max_staleness >= 1: the run's producer (pipeline) sampled the step ahead; the step waits for
    it (timing_s/wait_batch), and its times and staleness are metrics."""

    producer: Producer
    refuses: ClassVar[dict[str, str]] = {
        "dpo": SYNCHRONOUS,
        "sft": SYNCHRONOUS,
        "dynamic sampling": (
            "algorithm.dynamic_sampling samples further rounds inside a step, and {key} samples whole steps "
            "ahead: set one of them off"
        ),
        "colocate": "rollout.colocate gives the GPU to generation and training in turn, and {key} runs them at once: "
        "set one of them off",
    }

    def sample(self, mesh, number, indices, uids, more) -> StepSamples:
        t = Timer()
        with t("wait_batch"):
            gen, scored, seconds, version = self.producer.take(number)
        return gen, scored, dict(t), {**seconds, **staleness_metrics(number, version)}

    def before_push(self, version: int) -> None:
        self.producer.before_push(version)

    def after_push(self, version: int) -> None:
        self.producer.after_push(version)
