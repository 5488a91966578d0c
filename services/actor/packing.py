"""Padding-free passes (actor.padding_free): a micro-batch's sequences packed end to end into one row.

verl's layout pads every row of a micro-batch to its longest prompt and response; a packed pass runs
only the real tokens through the linear layers (most of a small model's compute, and the memory of its
activations). Positions restart at 0 for each sequence (RoPE sees what it sees padded), and attention
stays inside each sequence: the model runs with attention "meshrl_packed", which is SDPA for padded
calls and, given the sequences' boundaries (cu_seq_lens_q, the names HF's own packed flash-attention
path reads), attention over the packed row itself: on CUDA in half precision through flash-attention's
varlen kernel (torch.nn.attention.varlen), which computes no padding; elsewhere (CPU, fp32) one batched
causal SDPA over the sequences laid side by side again, as padded as before. What a layer adds to
causal attention (gpt-oss's sinks, Gemma-2's soft-cap, sliding windows, Llama-4's chunks) is applied
(services/actor/attention_extras.py), and a keyword it does not know is refused. The log-probs, values
and gradients are the padded eager pass's (tests compare them); the head is computed only at the
positions that predict a response token.

Rows that share a prompt (a GRPO group) pack it once: the row holds each distinct prompt, then each
row's response, and a response attends to its prompt's keys and values and to its own (Shared), the
shared-prompt pass of services/actor/model.py without its padded responses or HF's cache.
"""

import contextlib
import dataclasses
import functools
import inspect
import logging

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from meshrl.algos import router_replay
from services.actor import sequence
from services.actor.attention_extras import Extras

try:  # flash-attention's varlen kernel, through torch (CUDA only; torch >= 2.9 carries it)
    from torch.nn.attention.varlen import varlen_attn
except ImportError:  # pragma: no cover - the pinned torch has it
    varlen_attn = None  # type: ignore[assignment]

log = logging.getLogger(__name__)
NAME = "meshrl_packed"
OFF = False  # the kernel failed once here: pad from then on
PACKED = torch.zeros(1, 1, 0, 0, dtype=torch.bool)
"""The attention mask a packed call passes: 4-D, so HF's mask builders hand it on as it is instead of
building a (tokens x tokens) one; the attention below reads the boundaries instead."""


def attention(  # limit: transformers' attention interface, which calls it positionally
    module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs
):
    """HF's attention interface (its signature, which transformers calls positionally): query (1, heads,
    tokens, dim), key and value (1, kv heads, tokens, dim). With sequence parallelism (meshrl_sp) the
    tokens are this rank's slice of the row: attention runs on every token for this rank's share of the
    heads, between two all-to-alls (services/actor/sequence.py). What the layer adds to causal attention
    (sinks, soft-caps, windows: attention_extras.Extras) is applied; what it cannot be is refused."""
    bounds, shared = kwargs.get("cu_seq_lens_q"), kwargs.get("meshrl_shared")
    if bounds is None and shared is None:  # a padded call (a value model's, generation's)
        return padded(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    extras = Extras.of(module, kwargs, dropout)
    sp = kwargs.get("meshrl_sp")
    if sp is None:
        q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # (tokens, heads, dim)
        return attend(q, k, v, kwargs, scaling, extras)[None], None
    heads, n = query.shape[1], kwargs["meshrl_tokens"]  # the row's real tokens
    if extras.sinks is not None:  # this rank's heads' sinks (heads_for_tokens: rank r holds chunk r)
        extras = dataclasses.replace(extras, sinks=extras.sinks.view(sp.size, -1)[sp.rank])
    q = sp.heads_for_tokens(query[0])
    k, v = (sp.heads_for_tokens(sequence.kv_heads_for(t[0], heads, sp.size)) for t in (key, value))
    q, k, v = (t[:, :n].transpose(0, 1) for t in (q, k, v))  # the row's real tokens, (tokens, heads, dim)
    out = attend(q, k, v, kwargs, scaling, extras)
    return sp.tokens_for_heads(F.pad(out, (0, 0, 0, 0, 0, sp.width(n) * sp.size - n)))[None], None


def padded(  # limit: transformers' attention interface, which calls it positionally
    module, query, key, value, attention_mask, dropout, scaling, **kwargs
):
    """A padded call: SDPA over SDPA's masks; where the layer adds what SDPA drops (gpt-oss's sinks, Gemma-2's
    soft-cap), the model's own eager attention over the same masks made additive."""
    if kwargs.get("s_aux") is None and kwargs.get("softcap") is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    eager = getattr(inspect.getmodule(type(module)), "eager_attention_forward", None)
    if eager is None:
        raise ValueError(
            f"actor.padding_free: {type(module).__name__} adds sinks or a soft-cap and has no eager attention"
        )
    q_len, kv_len = query.shape[2], key.shape[2]
    if attention_mask is None and q_len > 1:  # SDPA's mask builder left causality to is_causal
        attention_mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=query.device).tril(kv_len - q_len)
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        attention_mask = torch.zeros(attention_mask.shape, dtype=query.dtype, device=query.device).masked_fill(
            ~attention_mask, torch.finfo(query.dtype).min
        )
    return eager(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kwargs: dict, scaling, extras: Extras) -> torch.Tensor:
    """A packed row's causal attention within each sequence (or, meshrl_shared, each response to its
    prompt and itself): (tokens, heads, dim), k and v (tokens, kv heads, dim) -> (tokens, heads, dim)."""
    bounds, shared = kwargs.get("cu_seq_lens_q"), kwargs.get("meshrl_shared")
    if shared is not None:
        return shared.attend(q, k, v, scaling, extras.within(shared.longest["keys"]))
    assert bounds is not None
    width = int(kwargs.get("max_length_q") or bounds.diff().max())
    extras = extras.within(width)
    out = flash(q, k, v, bounds, bounds, max_q=width, max_k=width, scaling=scaling, window=extras.kernel_window())
    if out is not None:
        return out
    # the sequences side by side again, each from its own start and padded on the right, for one batched
    # causal attention: a real token sees only its own sequence's earlier tokens, so causality is the only
    # mask (with a window or chunk, theirs too), and the padding's outputs are dropped (only the linear
    # layers run padding-free)
    index, real = window(bounds.diff(), 0)
    q, k, v = side_by_side(q, k, v, index, index)
    mask = None
    if extras.masked():
        place = torch.arange(index.shape[1], device=q.device)
        mask = extras.allowed(place[:, None], place[None, :])[None, None]
    return extras.attend(q, k, v, mask, scaling).transpose(1, 2)[real]


def kernel_runs(query: torch.Tensor) -> bool:
    """flash-attention's varlen kernel takes these tensors: CUDA, half precision, and the kernel built in."""
    return varlen_attn is not None and query.is_cuda and query.dtype in (torch.float16, torch.bfloat16) and not OFF


def flash(  # noqa: PLR0913 - the varlen kernel's inputs, the lengths and scale by name
    q, k, v, cu_q, cu_k, *, max_q: int, max_k: int, scaling, window: tuple[int, int] | None = (-1, 0)
):
    """Causal attention of packed sequences through the varlen kernel: q (tokens, heads, dim), k and v (key
    tokens, kv heads, dim), each query sequence aligned to the end of its key sequence (flash-attention's
    causal mask: a response sees its whole prompt); window: its window_size (Extras.kernel_window), None for a
    layer it cannot compute. None where the kernel cannot run (the caller pads)."""
    global OFF
    if window is None or not kernel_runs(q):
        return None
    groups = q.shape[1] // k.shape[1]
    kw = kernel_kwargs(varlen_attn, groups, window)
    if kw is None:
        return None
    if groups > 1 and "enable_gqa" not in kw:  # grouped-query attention on a kernel that takes equal heads only
        k, v = (t.repeat_interleave(groups, 1) for t in (k, v))
    try:
        out = varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, scale=scaling, **kw)
        assert isinstance(out, torch.Tensor)  # no return_aux asked for
        return out
    except RuntimeError as e:  # e.g. a GPU the kernel was not built for: pad, as on CPU, from now on
        log.warning("actor.padding_free: the varlen attention kernel failed (%s); padding attention instead", e)
        OFF = True
        return None


@functools.cache
def parameters(kernel) -> frozenset[str]:
    return frozenset(inspect.signature(kernel).parameters)


def kernel_kwargs(kernel, groups: int, window: tuple[int, int] = (-1, 0)) -> dict | None:
    """The causal and grouped-query arguments this torch's varlen_attn takes, or None where it cannot take
    what we need. torch >= 2.11 takes scale and window_size=(-1, 0) (causal, aligned to the end of the keys;
    (w - 1, 0): a sliding window of w);
    2.13 also enable_gqa (on 2.11 the caller repeats k and v to the query heads instead). 2.10's kernel has
    is_causal and no scale: the padded attention runs there."""
    names = parameters(kernel)
    if "window_size" not in names or "scale" not in names:
        return None
    return {"window_size": window, **({"enable_gqa": True} if groups > 1 and "enable_gqa" in names else {})}


def window(lengths: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sequences, longest) indices of each sequence's tokens from its own start, and which are real."""
    place = torch.arange(int(lengths.max()) if len(lengths) else 0, device=lengths.device)
    starts = start + F.pad(lengths.cumsum(0), (1, 0))[:-1]
    return starts[:, None] + place, place < lengths[:, None]


def side_by_side(q, k, v, queries: torch.Tensor, keys: torch.Tensor):
    """(tokens, heads, dim) gathered into (sequences, heads, width, dim) windows for SDPA, grouped-query
    keys and values repeated to the query heads."""
    last = q.shape[0] - 1
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    q = q[queries.clamp(max=last)].transpose(1, 2)
    k, v = (t[keys.clamp(max=last)].transpose(1, 2) for t in (k, v))
    return q, k, v


AttentionInterface.register(NAME, attention)
AttentionMaskInterface.register(NAME, sdpa_mask)  # padded calls get SDPA's masks


def enable(model: torch.nn.Module) -> None:
    """Run the model's attention through `attention` (a model that cannot switch is refused)."""
    can = getattr(model, "_can_set_attn_implementation", None)
    if not callable(can) or not can():
        raise ValueError(f"actor.padding_free: {type(model).__name__} cannot switch its attention implementation")
    config = getattr(model, "config", None)
    if getattr(config, "vision_config", None) is not None:
        # a vision-language model's tower attends over each picture's patches itself: SDPA there, which
        # ignores the packed row's boundaries that the forward passes on to the tower too
        model.set_attn_implementation({"": NAME, "text_config": NAME, "vision_config": "sdpa"})  # type: ignore[operator]
        return
    model.set_attn_implementation(NAME)  # type: ignore[operator]


class Shared:
    """Where each token of a packed row with shared prompts sits: every distinct prompt once, then every
    row's response, real tokens only. A prompt's tokens attend causally within it; a response's attend to
    its prompt's and to its own earlier ones, through the prompt's keys and values gathered into the
    response's window (an indexing op: the gradient sums back into the one prompt, as the shared-prompt
    pass's cache does)."""

    def __init__(self, prompt_lengths: torch.Tensor, response_lengths: torch.Tensor, inverse: torch.Tensor):
        device = prompt_lengths.device
        self.prompt_tokens = int(prompt_lengths.sum())
        self.prompts = window(prompt_lengths, 0)  # (G, Wp) indices, real
        self.responses = window(response_lengths, self.prompt_tokens)  # (B, Wr)
        (p_index, p_real), (r_index, r_real) = self.prompts, self.responses
        self.keys = torch.cat([p_index[inverse], r_index], 1)  # (B, Wp + Wr): its prompt, then itself
        keys_real = torch.cat([p_real[inverse], r_real], 1)
        width = r_index.shape[1]
        causal = torch.ones(width, p_index.shape[1] + width, dtype=torch.bool, device=device)
        causal[:, p_index.shape[1] :] = torch.tril(causal[:, p_index.shape[1] :])
        self.mask = (keys_real[:, None, :] & causal)[:, None]  # (B, 1, Wr, Wp+Wr)
        # each response's queries' and keys' positions in its sequence, for a window's or chunk's mask
        start = prompt_lengths[inverse][:, None]
        place = torch.arange(width, device=device)
        self.places = (
            start + place,
            torch.cat([torch.arange(p_index.shape[1], device=device).expand_as(p_index[inverse]), start + place], 1),
        )
        # the same for the varlen kernel: each response's keys (its prompt's, then its own) end to end
        self.flat_keys = self.keys[keys_real]
        key_lengths = prompt_lengths[inverse] + response_lengths
        self.cu = {
            name: F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
            for name, lengths in (("prompts", prompt_lengths), ("responses", response_lengths), ("keys", key_lengths))
        }
        self.longest = {
            name: int(lengths.max()) if len(lengths) else 0
            for name, lengths in (("prompts", prompt_lengths), ("responses", response_lengths), ("keys", key_lengths))
        }

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling, extras: Extras) -> torch.Tensor:
        """(tokens, heads, dim) each (k and v: kv heads) -> (tokens, heads, dim), with the layer's extras."""
        n, cu, longest = self.prompt_tokens, self.cu, self.longest
        top, wide = longest["prompts"], extras.kernel_window()
        fast = flash(
            q[:n], k[:n], v[:n], cu["prompts"], cu["prompts"], max_q=top, max_k=top, scaling=scaling, window=wide
        )
        if fast is not None:
            if q.shape[0] == n:
                return fast
            keys = self.flat_keys
            rest = flash(
                q[n:],
                k[keys],
                v[keys],
                cu["responses"],
                cu["keys"],
                max_q=longest["responses"],
                max_k=longest["keys"],
                scaling=scaling,
                window=wide,
            )
            if rest is not None:
                return torch.cat([fast, rest])
        index, real = self.prompts
        pq, pk, pv = side_by_side(q, k, v, index, index)
        mask = None
        if extras.masked():
            place = torch.arange(index.shape[1], device=q.device)
            mask = extras.allowed(place[:, None], place[None, :])[None, None]
        parts = [extras.attend(pq, pk, pv, mask, scaling).transpose(1, 2)[real]]
        index, real = self.responses
        if real.any():
            rq, rk, rv = side_by_side(q, k, v, index, self.keys)
            mask = self.mask
            if extras.masked():
                queries, keys = self.places
                mask = mask & extras.allowed(queries[:, :, None], keys[:, None, :])[:, None]
            parts.append(extras.attend(rq, rk, rv, mask, scaling).transpose(1, 2)[real])
        return torch.cat(parts)


def forward_packed_shared(
    model: torch.nn.Module, micro: dict, T: int, first: torch.Tensor, inverse: torch.Tensor, seen=None
):
    """What forward_response returns, (B, T, V), with each distinct prompt run once and every row's response
    padding-free, in one packed pass (the shared-prompt pass, services/actor/model.py, pads the responses).
    seen: the pictures of the distinct prompts (model.Seen), each encoded once."""
    ids, mask = micro["input_ids"], micro["attention_mask"]
    P = ids.shape[1] - T
    prompt = mask[first, :P].bool()  # left-padded
    response = mask[:, P:-1].bool()  # right-padded; the last column predicts nothing
    lengths = prompt.sum(1)
    shared = Shared(lengths, response.sum(1), inverse)
    last = shared.prompts[0].gather(1, (lengths - 1)[:, None])[:, 0]  # each prompt's last token: the first
    read = torch.cat(
        [last, torch.arange(shared.prompt_tokens, shared.prompt_tokens + int(response.sum()), device=ids.device)]
    )
    out = run_row(
        model,
        micro,
        lambda r: torch.cat([r[first, :P][prompt], r[:, P:-1][response]]),
        read,
        head_only_where_read=True,
        seen=seen,
        meshrl_shared=shared,
    )
    result = out.new_zeros((len(inverse), T, out.shape[-1]))
    result[:, 0] = out[: len(first)][inverse]
    result[:, 1:][response] = out[len(first) :]
    return result


def forward_packed(
    model: torch.nn.Module, micro: dict, T: int, head_only_where_read: bool, outputs: bool = True, seen=None
) -> torch.Tensor:
    """What forward_response returns, (B, T, ...), from one packed row of the micro-batch's real tokens;
    zeros where a row's response is padding. outputs=False: the head reads nothing (a pass for what the
    layers do, e.g. the routers' choices), and the result is all zeros. seen: the micro-batch's pictures
    (model.Seen), whose image tokens the row holds in the rows' order."""
    keep = micro["attention_mask"].bool()
    lengths = keep.sum(1)
    bounds = F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
    flat = (keep.flatten().cumsum(0) - 1).view(keep.shape)  # each real token's place in the packed row
    read = keep[:, -T - 1 : -1]  # positions whose output predicts a response token
    where = flat[:, -T - 1 : -1][read]
    if not outputs:
        read, where = torch.zeros_like(read), where[:0]
    picked = run_row(
        model,
        micro,
        lambda r: r[keep],
        where,
        head_only_where_read,
        cu_seq_lens_q=bounds,
        cu_seq_lens_k=bounds,
        max_length_q=int(lengths.max()),
        max_length_k=int(lengths.max()),
        seen=seen,
    )
    result = picked.new_zeros((*read.shape, picked.shape[-1]))
    result[read] = picked
    return result


def run_row(model: torch.nn.Module, micro: dict, pick, read: torch.Tensor, head_only_where_read: bool, seen=None, **kw):
    """The model's outputs at positions `read` (ascending) of the packed row pick(tensor) makes of the
    micro-batch's per-token tensors: (len(read), ...). With sequence parallelism this rank runs its slice
    of the row, and the group's outputs are gathered (every rank gets them all). seen: pictures
    (model.Seen), with their three-axis positions picked as the row's tokens are."""
    ids = pick(micro["input_ids"])
    sp = sequence.of(model)
    if sp is not None:  # this rank's slice of the row and of what is read in it
        start, width = sp.rank * sp.width(len(ids)), sp.width(len(ids))
        read = read[(read >= start) & (read < start + width)] - start
        kw = {**kw, "meshrl_sp": sp, "meshrl_tokens": len(ids)}
        sp.tokens = len(ids)  # for what reads the whole row's per-token outputs (a router's losses)
        pick = (lambda p: lambda r: sp.mine(p(r)))(pick)
    router_replay.feed(model, micro, pick)
    positions = pick(micro["position_ids"])[None]  # with sequence parallelism this rank's slice
    placed = contextlib.nullcontext()
    if seen is not None:
        positions = torch.stack([pick(axis) for axis in seen.positions])[:, None]  # (3, 1, tokens)
        kw = {**kw, **seen.inputs}
        placed = seen.placed(pick(seen.places))
    with placed:
        out = model(
            input_ids=(ids if sp is None else sp.mine(ids))[None],  # the row made once
            position_ids=positions,
            attention_mask=PACKED.to(ids.device),
            use_cache=False,
            **({"logits_to_keep": read} if head_only_where_read else {}),
            **kw,
        ).logits[0]
    # a model whose forward does not take logits_to_keep (VideoLLaMA-3's) gives every position's outputs
    picked = out if head_only_where_read and len(out) == len(read) else out[read]
    return picked if sp is None else sp.gather(picked)
