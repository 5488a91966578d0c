"""Sequence parallelism in the actor (actor.sequence_parallel=N), DeepSpeed-Ulysses style.

The ranks of the actor's group form groups of N consecutive ranks; the ranks of one group hold the same
micro-batches (the servicer sends each group one part), and each runs 1/N of every packed row's tokens
through the model: embeddings, norms, MLPs and the head see only this rank's slice. Attention needs every
token of a sequence, so the packed attention (services/actor/packing.py) trades the slice of all heads
for every token of 1/N of the heads (an all-to-all), attends as one rank would, and trades back. The read
positions' outputs are then gathered, so every rank of the group ends the pass with what one rank alone
would have: the losses above it, their totals over the world and the metrics need no change.

Gradients: every rank of a group computes the same loss from the gathered outputs, and the gather's
backward sums the N ranks' gradients into each slice, so a group's ranks together hold N times its
gradient. FSDP averages over all ranks, N per group, which makes that the group's gradient, exactly as N
ranks of plain data parallelism holding a copy of the group's rows each would get (the roles' totals
count every rank's rows, copies included). The heads' split needs the query heads, and the key/value
heads or their repetition to the query heads, to divide into N.

Tokens travel with torch.distributed's all_to_all_single, which gloo and NCCL both run, through an
autograd function whose backward is the same exchange the other way.
"""

import ctypes
import dataclasses
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

ATTR = "_meshrl_sequence_shards"  # where a model holds its Shards
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (MALLOC_MMAP_THRESHOLD_ in the environment)


class Exchange(torch.autograd.Function):
    """(N, ...) -> (N, ...): chunk j goes to rank j of the group, chunk j of the result came from rank j.
    Its own transpose, so the backward is the same exchange of the gradients."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        x = x.contiguous()  # first: empty_like keeps a view's strides, which the exchange would not follow
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous()
        out = torch.empty_like(grad)
        dist.all_to_all_single(out, grad, group=ctx.group)
        return out, None


@dataclasses.dataclass
class Shards:
    """This rank's place in its sequence-parallel group."""

    group: object  # a torch.distributed process group of `size` consecutive ranks
    size: int
    rank: int  # within the group
    tokens: int = 0  # the real tokens of the row in the pass (run_row sets it), padding past them

    def whole(self, x: torch.Tensor) -> torch.Tensor:
        """A per-token tensor of this rank's slice of the row in the pass -> the row's real tokens', every
        rank's slice in order (what a MoE router's losses read; the gradient goes back as gather's)."""
        return self.gather(x)[: self.tokens]

    def width(self, tokens: int) -> int:
        """Tokens each rank runs of a packed row of `tokens` (the row padded to a multiple of `size`)."""
        return -(-tokens // self.size)

    def mine(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's slice of a packed row's per-token tensor (tokens first), zero-padded at the end."""
        m = self.width(len(x))
        x = torch.cat([x, x.new_zeros((m * self.size - len(x), *x.shape[1:]))])  # any dtype, bool included
        return x[self.rank * m : (self.rank + 1) * m]

    def heads_for_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """(heads, m, dim), this rank's m tokens -> (heads / size, m * size, dim): every token of the
        group's row, for this rank's share of the heads."""
        h, m, d = x.shape
        x = x.reshape(self.size, h // self.size, m, d)  # chunk j: the heads rank j attends for
        got = Exchange.apply(x, self.group)  # chunk j: rank j's tokens of my heads
        return got.permute(1, 0, 2, 3).reshape(h // self.size, self.size * m, d)

    def tokens_for_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(tokens, heads / size, dim) for the whole row -> (m, heads, dim): this rank's tokens, every
        head (the inverse of heads_for_tokens, tokens first as attention returns them)."""
        n, h, d = x.shape
        x = x.reshape(self.size, n // self.size, h, d)  # chunk j: rank j's tokens
        got = Exchange.apply(x, self.group)  # chunk j: my tokens of rank j's heads
        return got.permute(1, 0, 2, 3).reshape(n // self.size, self.size * h, d)

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's (k_r, ...) in rank order, on every rank (k_r may differ); the gradient of each
        rank's part sums what every rank's loss gives it."""
        sizes = torch.zeros(self.size, dtype=torch.int64)
        sizes[self.rank] = len(x)
        dist.all_reduce(sizes, group=self.group)
        top = int(sizes.max())
        if top == 0:  # nothing anywhere (every rank knows): no exchange of empty buffers
            return x[:0]
        padded = F.pad(x, (0, 0) * (x.dim() - 1) + (0, top - len(x)))
        got = Exchange.apply(padded.expand(self.size, *padded.shape), self.group)  # my part to every rank
        return torch.cat([got[j, : int(sizes[j])] for j in range(self.size)])


def groups(size: int) -> Shards | None:
    """This rank's Shards, the group's ranks consecutive (ranks r*size .. r*size+size-1); None for 1.
    Collective: every rank makes every group, in the same order."""
    if size <= 1:
        return None
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % size:
        raise ValueError(f"actor.sequence_parallel={size} must divide the actor's world size ({world})")
    mine = None
    for first in range(0, world, size):
        group = dist.new_group(list(range(first, first + size)))
        if first <= rank < first + size:
            mine = Shards(group, size, rank - first)
    return mine


def return_large_buffers() -> bool:
    """glibc: buffers of 1 MiB and more come from mmap and go back to the system when freed, as
    MALLOC_MMAP_THRESHOLD_=1048576 would make them. By default glibc raises that threshold after the first
    large free, and the exchanges' buffers, of a new size at every layer, then grow the heap for good: one
    16k-token update peaked at 7.3 GiB a rank with the default and 5.0 with this (bench/RESULTS.md).
    True where it was set (Linux with glibc)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return bool(ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, 2**20))
    except (OSError, AttributeError):  # another C library
        return False


def check_heads(config, size: int) -> None:
    """The heads split into `size` (ValueError otherwise): query heads, and key/value heads or their
    repetition to the query heads (always, once the query heads split)."""
    config = getattr(config, "text_config", None) or config
    heads = getattr(config, "num_attention_heads", None)
    if heads is None or heads % size:
        raise ValueError(
            f"actor.sequence_parallel={size}: the model's {heads} attention heads do not split over {size} "
            "ranks (Ulysses splits the heads); pick a divisor of the heads"
        )


def of(model: torch.nn.Module) -> Shards | None:
    return getattr(model, ATTR, None)


def attach(model: torch.nn.Module, shards: Shards | None) -> None:
    object.__setattr__(model, ATTR, shards)  # an attribute, not a submodule


def kv_heads_for(k: torch.Tensor, heads: int, size: int) -> torch.Tensor:
    """(kv heads, tokens, dim) repeated to the query heads where the key/value heads do not split into
    `size` (grouped-query attention with fewer key/value heads than ranks)."""
    if k.shape[0] % size == 0:
        return k
    return k.repeat_interleave(heads // k.shape[0], 0)
