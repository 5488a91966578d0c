"""The environment service's settings. EnvSettings is what a run sets (its `env.*` section adds the run's
own keys); EnvConfig adds the service's own limits."""

import dataclasses

from meshrl.config.checked import Checked, require


@dataclasses.dataclass
class EnvSettings(Checked):
    module: str = "services.env.calculator:Calculator"
    """The environment class, "package.module:Class" or "path/to/file.py:Class"; one object per episode,
    with reset(task, seed) -> observation and step(action) -> (observation, reward, done, info)."""
    step_timeout: float = 30.0
    """Seconds a reset or step may take; a slower one ends its episode (ABORTED)."""
    workers: int = 64
    """Calls served at once (episodes wait on tools, not on this process's cores); a run gives its service
    at least rollout.concurrency."""
    processes: int = 4
    """Worker processes holding the environment objects (at most workers), each episode in one of them. A
    call past step_timeout stops its process and loses the episodes in it: more processes lose fewer."""

    def __post_init__(self) -> None:
        super().__post_init__()
        require(":" in self.module, self, "module", "must look like package.module:Class or path/to/file.py:Class")
        require(self.step_timeout > 0, self, "step_timeout", "must be > 0")
        require(self.workers >= 1, self, "workers", "must be >= 1")
        require(self.processes >= 1, self, "processes", "must be >= 1")


@dataclasses.dataclass
class EnvConfig(EnvSettings):
    max_episodes: int = 4096
    """Episodes open at once; a Reset beyond them is RESOURCE_EXHAUSTED."""
    idle_timeout: float = 600.0
    """An episode not stepped for this long is closed (its caller went away)."""
    max_action_chars: int = 65536
    """A longer action is INVALID_ARGUMENT."""

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.max_episodes >= 1, self, "max_episodes", "must be >= 1")
        require(self.idle_timeout > 0, self, "idle_timeout", "must be > 0")
        require(self.max_action_chars >= 1, self, "max_action_chars", "must be >= 1")
