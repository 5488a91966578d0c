"""The step contract: what an algorithm is to the run loop (orchestrator.run.trainer).

An algorithm says which services it needs and which of them it trains, does one step given the step's
prompts, and keeps what else it carries from step to step (a KL coefficient, say) in its state dict, which
a checkpoint holds. Everything else (services, resume, validation, checkpoints, recovery) is the run
loop's, so a run of any algorithm is killed, resumed and recovered the same way.
"""

from typing import Protocol

from orchestrator.config import Config
from orchestrator.data import PromptDataset
from orchestrator.lifecycle.mesh import Mesh
from orchestrator.sampling.rollouts import Rollouts


class Algorithm(Protocol):
    name: str

    @property
    def trained(self) -> tuple[str, ...]:  # a field, or a property (PolicyGradient: with or without a critic)
        """The roles whose checkpoints make up a run's state."""

    def setup(self, cfg: Config) -> set[str]:
        """Check the config, (re)set the algorithm's own state; the services (roles) it needs."""

    def step(
        self,
        mesh: Mesh,
        rollouts: Rollouts,
        number: int,
        data: PromptDataset,
        indices: list[int],
        uids: list[str],
    ) -> dict[str, float]:
        """Step `number` on the prompts data[indices]: sample and push through `rollouts`, train through
        `mesh`; the step's metrics."""

    def state_dict(self) -> dict: ...
    def load_state_dict(self, state: dict) -> None: ...
