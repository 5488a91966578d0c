"""Log-probs (and entropy) of the response tokens without the full-vocabulary logits of the micro-batch.

The head (lm_head) is what a long response's memory goes to: with a 152k vocabulary one (4,096 x V)
logits tensor in fp32 is 2.4 GB, and log_softmax, the temperature's copy, softmax for the entropy and
their gradients hold several at once (issue 46: 10.1 GiB for a 25M model's 4,096-token micro-batch). So
the pass runs the model with its head stood in for by a module that returns the hidden states, keeps the
(B, T, H) states that predict the response tokens, and applies the head to chunks of real tokens
(CHUNK_BYTES of logits each) that compute their log-probs and entropy and are dropped; in a pass with
gradients each chunk is recomputed in the backward (activation checkpointing), as Liger's fused linear
cross-entropy and verl's chunked entropy do. Padding is never put through the head.

The head module itself is called on each chunk, so what it is (a Linear, tied to the embeddings or not,
peft's wrappers, an FSDP root's unsharded weight) does not matter. A model that changes the head's output
before returning it (Gemma2's soft-capping, Cohere's logit_scale, Granite's logits_scaling) is noticed at
its first pass (its output is not the head's) and keeps the full-logits pass from then on, and so does the
fsdp1 engine (its root reshards when the forward ends, before the head could read its weight; fsdp2's root
keeps its parameters gathered until the backward). With sequence parallelism (services/actor/sequence.py)
each rank of a group puts its share of the tokens through the head, and the terms are gathered.
"""

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.distributed.fsdp import FullyShardedDataParallel
from torch.utils.checkpoint import checkpoint

from services.actor import sequence
from services.actor.model import forward_response, logprobs_and_entropy

CHUNK_BYTES = 256 * 2**20  # fp32 logits per chunk: ~441 tokens at a 152k vocabulary; a small one runs whole
UNFUSED = "_meshrl_full_logits"  # set on a model whose forward changes what its head returns
SLOT = "_meshrl_head_slot"  # where a model holds its head (head_slot)


class Hidden(torch.nn.Module):
    """Stands in for the head during a pass: returns the hidden states it is given, and remembers them so
    that the model's output can be checked to be them (ok: every output was)."""

    def __init__(self) -> None:
        super().__init__()
        self.given: list[torch.Tensor] = []
        self.ok = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.given.append(x)
        return x


def response_logprobs(
    model: torch.nn.Module,
    micro: dict,
    temperature: float = 1.0,
    *,
    share_prompts: bool = False,
    entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(B, T) log p(response token) under softmax(logits / temperature) in fp32, and its entropy (or None);
    zeros on padding."""
    head = output_head(model)
    # FSDP1 reshards its root when the forward ends: the head's weight is a flat shard by the time it is read
    if head is None or getattr(model, UNFUSED, False) or isinstance(model, FullyShardedDataParallel):
        return full_logits(model, micro, temperature, share_prompts, entropy)
    with hidden_out(model, head) as stand_in:
        hidden = forward_response(model, micro, share_prompts=share_prompts)
    if not stand_in.ok:
        setattr(model, UNFUSED, True)  # every rank runs the same model: all take this path together
        return full_logits(model, micro, temperature, share_prompts, entropy)
    T = hidden.shape[1]
    real = micro["attention_mask"][:, -T:].bool()
    lp, ent = by_rank(model, head, hidden[real], micro["responses"][real], temperature, entropy)
    out_lp = hidden.new_zeros(real.shape, dtype=torch.float32).masked_scatter(real, lp)
    out_ent = hidden.new_zeros(real.shape, dtype=torch.float32).masked_scatter(real, ent) if entropy else None
    return out_lp, out_ent


def by_rank(
    model: torch.nn.Module, head: torch.nn.Module, hidden: torch.Tensor, tokens: torch.Tensor, temperature, entropy
) -> tuple[torch.Tensor, torch.Tensor]:
    """chunked(); with sequence parallelism each rank of the group puts its share of the tokens through the
    head and the group's terms are gathered (every rank has every token's hidden state by then)."""
    shards = sequence.of(model)
    if shards is None:
        return chunked(head, hidden, tokens, temperature, entropy)
    lp, ent = chunked(head, shards.mine(hidden), shards.mine(tokens), temperature, entropy)
    both = shards.gather(torch.stack([lp, ent], 1))[: len(tokens)]
    return both[:, 0], both[:, 1]


def chunked(
    head: torch.nn.Module, hidden: torch.Tensor, tokens: torch.Tensor, temperature: float, entropy: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(N,) log-probs and entropies (zeros unless asked) of N tokens from their (N, H) hidden states."""
    vocab = vocab_size(head, hidden)
    size = max(1, CHUNK_BYTES // (4 * vocab))
    if hidden.shape[0] <= size:  # one chunk: nothing to save by recomputing it
        return head_terms(head, hidden, tokens, temperature, entropy)
    recompute = torch.is_grad_enabled() and hidden.requires_grad
    parts = []
    for h, t in zip(hidden.split(size), tokens.split(size)):
        if recompute:
            parts.append(checkpoint(head_terms, head, h, t, temperature, entropy, use_reentrant=False))
        else:
            parts.append(head_terms(head, h, t, temperature, entropy))
    lps, ents = zip(*parts)
    return torch.cat(lps), torch.cat(ents)


def head_terms(
    head: torch.nn.Module, hidden: torch.Tensor, tokens: torch.Tensor, temperature: float, entropy: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    lp, ent = logprobs_and_entropy(head(hidden), tokens, temperature, entropy)
    return lp, (ent if ent is not None else torch.zeros_like(lp))  # checkpoint wants tensors


def full_logits(
    model: torch.nn.Module, micro: dict, temperature: float, share_prompts: bool, entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The pass with the whole (B, T, V) logits: for models whose head cannot be stood in for."""
    logits = forward_response(model, micro, share_prompts=share_prompts)
    return logprobs_and_entropy(logits, micro["responses"], temperature, entropy)


def output_head(model: torch.nn.Module) -> torch.nn.Module | None:
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    return head if isinstance(head, torch.nn.Module) else None


def vocab_size(head: torch.nn.Module, hidden: torch.Tensor) -> int:
    size = getattr(head, "out_features", None) or getattr(getattr(head, "weight", None), "shape", [0])[0]
    return int(size) if size else int(head(hidden[:1]).shape[-1])


@contextmanager
def hidden_out(model: torch.nn.Module, head: torch.nn.Module) -> Iterator[Hidden]:
    """The model with its head replaced by Hidden for the pass; its `ok` says whether every output the
    model returned was the hidden states themselves."""
    parent, name = head_slot(model, head)
    stand_in = Hidden()

    def check(_module, _args, output) -> None:
        logits = getattr(output, "logits", None)
        stand_in.ok &= logits is not None and any(logits is g for g in stand_in.given)
        stand_in.given.clear()

    hook = model.register_forward_hook(check)
    setattr(parent, name, stand_in)
    try:
        yield stand_in
    finally:
        setattr(parent, name, head)
        hook.remove()


def head_slot(model: torch.nn.Module, head: torch.nn.Module) -> tuple[torch.nn.Module, str]:
    """The module that holds the head and the head's name there, found once a model (not every pass)."""
    slot = getattr(model, SLOT, None)
    if slot is None or getattr(slot[0], slot[1], None) is not head:
        slot = next((m, n) for m in model.modules() for n, c in m.named_children() if c is head)
        object.__setattr__(model, SLOT, slot)  # an attribute, not a submodule
    return slot
