"""One run's state while it runs: what the run loop, its checkpoints and its recovery work on.

    state = RunState(cfg, services, mesh, algorithm, tokenizer, data, sampler, val, number=first)
    state.sample_ahead()            # trainer.max_staleness >= 1: the producer starts (once)
    indices, uids = state.draw()    # the step's batch, from the sampler or the producer
    rollouts = state.rollouts()     # what the step samples and pushes through
    number, batch = recover(error, state)

The run loop (trainer) owns it: the services and their clients, the algorithm, the data and where it is
drawn from, and the producer that samples ahead. Nothing below the run loop holds any of it: the mesh is
the services and the calls on them, a step gets its samples through the Rollouts it is handed.
"""

import dataclasses
import pathlib

from orchestrator.config import Config
from orchestrator.data import PromptDataset, Sampler
from orchestrator.lifecycle.mesh import Mesh
from orchestrator.lifecycle.services import Services
from orchestrator.loops.algorithm import Algorithm
from orchestrator.output.loggers import RunLog
from orchestrator.run.parity import Parity
from orchestrator.sampling import pipeline
from orchestrator.sampling.dynamic import Dynamic
from orchestrator.sampling.partial import Partial
from orchestrator.sampling.rollouts import Now, Rollouts, StepSampler


@dataclasses.dataclass
class RunState:
    cfg: Config
    services: Services  # the processes started here (and restarted)
    mesh: Mesh  # the clients every call goes through
    algorithm: Algorithm
    tokenizer: object  # the actor's: multi-turn observations
    data: PromptDataset  # the training prompts
    sampler: Sampler  # their order; its position is part of a checkpoint
    val: PromptDataset | None = None  # the held-out prompts, if any
    number: int = 1  # the step being done
    batch: tuple | None = None  # its (indices, uids); None: not drawn yet
    done: int = 0  # the last step a checkpoint holds
    restarts: int = 0  # failed steps recovered from so far
    log: RunLog | None = None  # metrics, samples and loggers: open while the steps run
    start: dict = dataclasses.field(default_factory=dict)  # recovery.snapshot() before the first step: where a
    #   run without a checkpoint goes back to
    producer: pipeline.Producer | None = None  # trainer.max_staleness >= 1: samples the next steps ahead
    partial: Partial | None = None  # rollout.partial: the unfinished samples carried between steps
    before_producer: dict = dataclasses.field(default_factory=dict)  # the sampler's state when it started
    fleet: dict | None = None  # the last RUN_DIR/fleet.json acted on (run.fleet.resize)
    parity: Parity = dataclasses.field(default_factory=Parity)  # stops a run whose rollout disagrees with the
    #   actor (run.parity.of: its bound; this default has none, only the jump after a push)

    @property
    def run_dir(self) -> pathlib.Path:
        return pathlib.Path(self.cfg.trainer.run_dir)

    def sample_ahead(self) -> None:
        """With trainer.max_staleness >= 1, start the producer (if it is not running): it draws the batches
        from this step on."""
        if self.cfg.trainer.max_staleness and self.producer is None and self.partial is None:
            self.before_producer = self.sampler.state_dict()
            self.producer = pipeline.start(self.cfg, self.mesh, self.tokenizer, self.data, self.sampler, self.number)

    def draw(self) -> tuple:
        """The step's (indices, uids): the one it had (a step done again), or the next batch."""
        self.batch = self.batch or (self.producer.batch(self.number) if self.producer else self.sampler.next())
        return self.batch

    def rollouts(self) -> Rollouts:
        """What the step samples and pushes weights through."""
        more = None if self.producer else self.sampler.next
        return Rollouts(self.mesh, self.tokenizer, self.step_sampler(), more=more)

    def step_sampler(self) -> StepSampler:
        """When the step samples: the one choice of the run's step sampler (what each cannot be combined
        with was refused at setup, sampling.combinations)."""
        if self.partial is not None:  # rollout.partial: rounds from the run's carry
            return self.partial
        if self.producer is not None:  # trainer.max_staleness: sampled ahead
            return pipeline.Ahead(self.producer)
        now = Now(self.tokenizer, self.data)
        return Dynamic(now) if self.cfg.algorithm.dynamic_sampling else now

    def sampler_state(self, number: int) -> dict:
        """The sampler's position after step `number`'s batch, as a checkpoint at `number` records it (the
        producer has drawn further)."""
        return self.sampler.state_dict() if self.producer is None else self.producer.sampler_state(number)

    def stop_sampling_ahead(self) -> None:
        """After a failed step nothing sampled ahead survives: the producer stops and the sampler goes back
        to where the step drew its batch (it draws again)."""
        if self.producer is None:
            return
        producer, self.producer = self.producer, None
        producer.stop()
        self.sampler.load_state_dict(producer.states.get(self.number - 1, self.before_producer))
        self.batch = None
