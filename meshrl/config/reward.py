"""The reward service's settings (one typed object; the CLI flags mirror its fields)."""

import dataclasses

ON_ERROR = ("fail", "score")


@dataclasses.dataclass
class RewardConfig:
    function: str | None = None
    """A user function "path/to/file.py:name" with verl's compute_score signature; None: the
    built-in scorers, picked per sample by data_source."""
    batched: bool = False
    """The function takes lists (data_sources, solution_strs, ground_truths, extra_infos)."""
    model: str | None = None
    """A HuggingFace sequence-classification model folder: score prompt+response with it."""
    workers: int = 2
    """Worker processes for functions; 0 runs them in the service process (no timeout, no isolation)."""
    timeout: float = 10.0
    """Seconds one sample may take in a worker before it counts as timed out."""
    on_error: str = "fail"
    """A sample that fails or times out: "fail" the request naming the sample, or "score" it as
    error_score and count it in the metrics."""
    error_score: float = 0.0
    """The score a failed sample gets with on_error=score."""
    batch_size: int = 32
    """Reward model: samples per forward pass."""
    max_length: int = 1024
    """Reward model: tokens kept per sample (the start is cut, the response end kept)."""
    device: str = "auto"
    """Reward model: "cpu", "cuda", or "auto" (cuda when available)."""

    def __post_init__(self):
        if self.on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, got {self.on_error!r}")
        if self.function and self.model:
            raise ValueError("give either function or model, not both")
        if self.batched and not self.function:
            raise ValueError("batched applies to a user function; give function too")
        if self.workers < 0 or self.timeout <= 0 or self.batch_size < 1 or self.max_length < 1:
            raise ValueError("workers must be >= 0; timeout, batch_size and max_length > 0")

    @property
    def backend(self) -> str:
        return "model" if self.model else "function" if self.function else "rule"
