"""Sampling for the hf backend with each sample's own random stream, so what a prompt samples does not
depend on the other prompts of its call (how many, how long, or how a rollout fleet split them).

transformers' sampling draws every row from one torch generator: sample i of a call then depends on
the rows drawn with it, so a call of [a, b, c, d] samples a and b differently from a call of [a, b]. Here
generate runs greedy (argmax) over scores this processor makes one-hot: it applies transformers' own
temperature, top-k and top-p warpers, then picks each row's token by inverse CDF with a uniform from that
row's stream, seeded by (the prompt's seed, the sample's index among the prompt's n). The prompt's seed
is the call's seed + its index in the call, as vLLM's per-request seeds are, so a part of a call that
starts at prompt a and carries seed + a samples what the whole call would.

What is left: a row's logits can differ in the last bits between batches (other padding widths and
batch sizes pick other kernels; ~1e-6 on a tiny model in fp32), which moves a token only when its
uniform falls that close to a boundary of the CDF.
"""

import random

import torch
from transformers import LogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper


class RowSampler(LogitsProcessor):
    """Picks row r's next token from its own stream; rows are prompt-major (prompt i's n samples
    adjacent), as the hf backend lays them out. The scores it returns are 0 at the pick, -inf elsewhere."""

    def __init__(self, seeds: list[int], n: int, temperature: float, top_k: int, top_p: float):
        assert temperature > 0, "greedy needs no sampler"
        self.streams = [random.Random(f"meshrl/{seed}/{j}") for seed in seeds for j in range(n)]
        self.warpers: list[LogitsProcessor] = [TemperatureLogitsWarper(temperature)]
        if top_k > 0:
            self.warpers.append(TopKLogitsWarper(top_k))
        if top_p < 1.0:
            self.warpers.append(TopPLogitsWarper(top_p))

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        assert scores.shape[0] == len(self.streams), (scores.shape, len(self.streams))
        for warp in self.warpers:
            scores = warp(input_ids, scores)  # (B, V); -inf where top-k/top-p cut
        # float64 CDF: the pick is then a function of the row's own probabilities and uniform alone
        cdf = torch.softmax(scores.double(), -1).cumsum(-1)  # (B, V)
        u = torch.tensor([s.random() for s in self.streams], dtype=torch.float64, device=scores.device)  # (B,)
        # right=True: the first token whose CDF passes u * total, so a token of probability 0 is never picked
        picks = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1), right=True).clamp(max=cdf.shape[1] - 1)
        out = torch.full_like(scores, -torch.inf)
        return out.scatter_(-1, picks, 0.0)


def row_seeds(seed: int | None, prompts: int) -> list[int]:
    """Prompt i's seed: the call's + i; without one, a fresh draw per call (samples not reproducible)."""
    base = random.getrandbits(62) if seed is None else seed
    return [base + i for i in range(prompts)]
