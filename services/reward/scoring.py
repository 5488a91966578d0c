"""The four ways the service scores: built-in rules, a user function, a reward model, a remote server.

Each scorer takes samples and returns one Outcome per sample. Rule and user
functions run in the worker pool (or in process when workers=0); the reward
model runs batched in the service process, on its device; an OpenRLHF-style
server at reward.url is asked over HTTP (services/reward/remote.py).
"""

import logging
from collections.abc import Callable

import torch

from meshrl.config.reward import RewardConfig, urls
from meshrl.errors import InvalidArgument
from services.reward import functions
from services.reward.pool import Outcome, WorkerPool
from services.reward.remote import UrlScorer
from services.reward.samples import Sample
from services.reward.scorers import BY_DATA_SOURCE

log = logging.getLogger(__name__)


class FunctionScorer:
    """A function: "builtin" (dispatch by data_source) or a user's file:name, of verl's form or TRL's."""

    def __init__(self, spec: str, batched: bool, workers: int, timeout: float):
        self.spec = spec
        self.pool = WorkerPool(spec, workers, timeout, batched).start() if workers else None
        self.fn: Callable | None = None
        # the loaded function says whether it takes lists and may answer None (TRL's form does both)
        if self.pool:
            self.batched, self.none_ok = self.pool.batched, self.pool.none_ok
        else:
            self.fn = functions.load(spec, batched)
            self.batched, self.none_ok = functions.is_batched(self.fn, batched), isinstance(self.fn, functions.TRLCall)

    def score(self, samples: list[Sample]) -> list[Outcome]:
        if self.spec == "builtin":
            check_builtin(samples)
        if not samples:
            return []
        args = [s.args if self.none_ok else s.args[:4] for s in samples]  # verl's form reads only its four
        if self.pool:
            return self.pool.score(args)
        if self.batched:
            from services.reward.worker import score_batch

            return [Outcome(**r) for r in score_batch(self.fn, args)]
        from services.reward.worker import score_one

        return [Outcome(**score_one(self.fn, a)) for a in args]

    def close(self):
        if self.pool:
            self.pool.close()


def check_builtin(samples: list[Sample]) -> None:
    """Bad rows for the built-in scorers are the caller's error: refuse the request naming the row."""
    for i, s in enumerate(samples):
        if s.data_source not in BY_DATA_SOURCE:
            raise InvalidArgument(
                f"row {i}: no built-in scorer for data_source {s.data_source!r}; built-in: {sorted(BY_DATA_SOURCE)}"
            )
        if s.ground_truth is None:
            raise InvalidArgument(f"row {i}: reward_model.ground_truth is missing")


class ModelScorer:
    """A HuggingFace sequence-classification model: the first logit of prompt+response is the score."""

    none_ok = False  # every sample gets a logit

    def __init__(self, path: str, batch_size: int, max_length: int, device: str):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device, self.batch_size = torch.device(device), batch_size
        self.tokenizer = AutoTokenizer.from_pretrained(path, truncation_side="left", padding_side="left")
        self.model = AutoModelForSequenceClassification.from_pretrained(path).to(self.device).eval()
        self.max_length = max_length

    def text(self, s: Sample) -> str:
        if s.prompt_text is not None and self.tokenizer.chat_template:
            # tokenize=False: the text (transformers' annotation is the union of every mode's return)
            return self.tokenizer.apply_chat_template(  # type: ignore[return-value]
                [{"role": "user", "content": s.prompt_text}, {"role": "assistant", "content": s.response_text}],
                tokenize=False,
            )
        return (s.prompt_text or "") + s.response_text

    @torch.no_grad()
    def score(self, samples: list[Sample]) -> list[Outcome]:
        out = []
        for start in range(0, len(samples), self.batch_size):
            texts = [self.text(s) for s in samples[start : start + self.batch_size]]
            enc = self.tokenizer(
                texts, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
            ).to(self.device)
            logits = self.model(**enc).logits[:, 0].float().cpu()
            out += [
                Outcome(score=v) if torch.isfinite(torch.tensor(v)) else Outcome(error=f"model gave {v}")
                for v in logits.tolist()
            ]
        return out

    def close(self):
        pass


def make_scorer(cfg: RewardConfig):
    if cfg.url:
        return UrlScorer(urls(cfg.url), cfg.batch_size, cfg.timeout, cfg.url_retries)
    if cfg.model:
        return ModelScorer(cfg.model, cfg.batch_size, cfg.max_length, cfg.device)
    return FunctionScorer(cfg.function or "builtin", cfg.batched, cfg.workers, cfg.timeout)
