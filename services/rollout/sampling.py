"""Sampling settings from the request, checked, and what a backend returns per sample."""

import dataclasses
import math
from typing import Any

from meshrl.errors import InvalidArgument
from meshrl.v1 import rollout_pb2

MAX_STOPS = 64  # stop strings per request
MAX_STOP_CHARS = 1024  # characters per stop string: the hf rollout searches each at every step (400,000: 48 s)


@dataclasses.dataclass
class Sampling:
    n: int
    temperature: float  # 0: greedy
    top_p: float
    top_k: int  # -1: off
    max_new_tokens: int
    stop: list[str]
    stop_token_ids: list[int]
    seed: int | None
    logprobs: bool
    routed_experts: bool = False  # a mixture of experts: each token's chosen experts (routing replay R3)


@dataclasses.dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[float] | None  # of each sampled token, after temperature
    text: str
    finish_reason: str  # "stop" or "length"
    # asked for (Sampling.routed_experts): the experts every token but the last was routed to, prompt then
    # response, (len(prompt) + len(token_ids) - 1, layers, top-k) as vLLM's CompletionOutput gives them
    routed_experts: Any = None
    # on_update=keep, a backend that tracks it per sample (vLLM): the token counts at which each weight update
    # during the generation took effect (token t is from the version after the updates at counts <= t)
    switches: list[int] | None = None


def from_proto(p: rollout_pb2.SamplingParams) -> Sampling:
    """Unset fields: temperature 0 (greedy), top_p 1, top_k off. Bad values name the field."""
    if p.n < 1:
        raise InvalidArgument(f"sampling.n must be >= 1, got {p.n}")
    if p.max_new_tokens < 1:
        raise InvalidArgument(f"sampling.max_new_tokens must be >= 1, got {p.max_new_tokens}")
    if not 0 <= p.temperature < math.inf:
        raise InvalidArgument(f"sampling.temperature must be a finite number >= 0, got {p.temperature}")
    if not 0 <= p.top_p <= 1:
        raise InvalidArgument(f"sampling.top_p must be in (0, 1], got {p.top_p}")
    if p.top_k < -1:
        raise InvalidArgument(f"sampling.top_k must be -1 (off) or >= 1, got {p.top_k}")
    if any(not s for s in p.stop):
        raise InvalidArgument("sampling.stop holds an empty string")
    if len(p.stop) > MAX_STOPS or any(len(s) > MAX_STOP_CHARS for s in p.stop):
        raise InvalidArgument(f"sampling.stop may hold {MAX_STOPS} strings of {MAX_STOP_CHARS} characters at most")
    greedy = p.greedy or p.temperature == 0
    return Sampling(
        n=p.n,
        temperature=0.0 if greedy else p.temperature,
        top_p=p.top_p or 1.0,
        top_k=p.top_k if p.top_k > 0 else -1,
        max_new_tokens=p.max_new_tokens,
        stop=list(p.stop),
        stop_token_ids=list(p.stop_token_ids),
        seed=p.seed if p.HasField("seed") else None,
        logprobs=p.logprobs,
        routed_experts=p.routed_experts,
    )
