"""The environment service's settings."""

import dataclasses


@dataclasses.dataclass
class EnvConfig:
    env: str = "services.env.calculator:Calculator"
    """The environment class, "package.module:Class" or "path/to/file.py:Class"; one object per episode,
    with reset(task, seed) -> observation and step(action) -> (observation, reward, done, info)."""
    max_episodes: int = 4096
    """Episodes open at once; a Reset beyond them is RESOURCE_EXHAUSTED."""
    step_timeout: float = 30.0
    """Seconds a reset or step may take; a slower one ends its episode (ABORTED)."""
    idle_timeout: float = 600.0
    """An episode not stepped for this long is closed (its caller went away)."""
    max_action_chars: int = 65536
    """A longer action is INVALID_ARGUMENT."""
    workers: int = 64
    """Calls served at once (episodes wait on tools, not on this process's cores)."""
    processes: int = 4
    """Worker processes holding the environment objects (at most workers), each episode in one of them. A
    call past step_timeout stops its process and loses the episodes in it: more processes lose fewer."""

    def __post_init__(self):
        if ":" not in self.env:
            raise ValueError(f"env must look like package.module:Class or path/to/file.py:Class, got {self.env!r}")
        if (
            min(self.max_episodes, self.max_action_chars, self.workers, self.processes) < 1
            or min(self.step_timeout, self.idle_timeout) <= 0
        ):
            raise ValueError("max_episodes, max_action_chars, workers and processes must be >= 1, the timeouts > 0")
