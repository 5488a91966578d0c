"""The reward service's settings (one typed object; the CLI flags mirror its fields). A run sets every one
of them (its `reward.*` section is this class and the service's address)."""

import dataclasses
import urllib.parse

from meshrl.config.checked import Checked, FieldError, one_of, require

ON_ERROR = ("fail", "score")


@dataclasses.dataclass
class RewardConfig(Checked):
    function: str | None = None
    """A user function "path/to/file.py:name" with verl's compute_score signature, or TRL's reward function
    form (completions, **kwargs), told apart by its signature; None: the built-in scorers, picked per
    sample by data_source."""
    batched: bool = False
    """The function takes lists: compute_score(data_sources=, solution_strs=, ground_truths=,
    extra_infos=) -> list, as verl's batched reward manager calls it (TRL's form is batched anyway)."""
    model: str | None = None
    """A HuggingFace sequence-classification model folder: it scores prompt + response through its own
    chat template, instead of a function or the built-in scorers."""
    url: str | None = None
    """An OpenRLHF-style remote reward server, http(s)://HOST[:PORT]/PATH (OpenRLHF's --remote_rm_url), or
    several, comma-separated (the requests go round the list): each batch is POSTed as {"query", "prompts",
    "labels"} and scored by the reply's "rewards", instead of a function, a model or the built-in scorers."""
    url_retries: int = 2
    """url: a request that cannot connect, times out or gets HTTP 429 or 5xx is sent again this many times
    (to the next server of the list), after 0.5 s, 1 s, 2 s ...; a 4xx or a malformed reply is not."""
    sandbox: str | None = None
    """HOST:PORT of a sandbox service (`meshrl serve sandbox`) where the built-in code scorer (data_source
    "code", "apps", "codecontests", "codeforces", "taco") runs programs, or "auto": the reward service starts
    one of its own, on its machine; a user function finds the address in the MESHRL_SANDBOX variable."""
    workers: int = 2
    """Worker processes for functions; 0 runs them in the service process (no timeout, no isolation)."""
    timeout: float = 10.0
    """Seconds one sample may take in a worker before it counts as failed; with url, one request."""
    on_error: str = "fail"
    """A sample that fails or times out: "fail" the request naming the sample, or "score" it as
    error_score, counted in reward/num_failed and warned about."""
    error_score: float = 0.0
    """The score a failed sample gets with on_error=score."""
    batch_size: int = 32
    """Reward model: samples per forward pass; url: samples per request."""
    max_length: int = 1024
    """Reward model: tokens kept per sample (the start is cut, the response end kept)."""
    device: str = "auto"
    """Reward model: "cpu", "cuda", or "auto" (cuda when available)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        one_of(self, "on_error", ON_ERROR)
        given = [f"{{{k}}}" for k in ("function", "model", "url") if getattr(self, k)]
        if len(given) > 1:
            both = "both" if len(given) == 2 else "all"
            raise FieldError(f"{' and '.join(given)} {both} set: a sample is scored by one of them")
        if self.url is not None:
            for one in urls(self.url):
                check_url(one)
        require(self.url_retries >= 0, self, "url_retries", "must be >= 0")
        require(
            not self.batched or bool(self.function), self, "batched", "applies to a user function: set function too"
        )
        require(self.workers >= 0, self, "workers", "must be >= 0")
        require(self.timeout > 0, self, "timeout", "must be > 0")
        require(self.batch_size >= 1, self, "batch_size", "must be >= 1")
        require(self.max_length >= 1, self, "max_length", "must be >= 1")

    @property
    def backend(self) -> str:
        return "model" if self.model else "url" if self.url else "function" if self.function else "rule"


def urls(url: str) -> list[str]:
    """The servers reward.url names, in order."""
    return [u.strip() for u in url.split(",") if u.strip()]


def check_url(url: str) -> None:
    """http(s)://HOST[:PORT]/...: anything else would only fail at the first step's POST."""
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port  # ValueError: not a number, or out of range
    except ValueError:
        port = -1
    if parts.scheme not in ("http", "https") or not parts.hostname or port == -1:
        raise FieldError(f"{{url}}={url} must be http(s)://HOST[:PORT]/PATH (OpenRLHF's remote_rm_url)")
