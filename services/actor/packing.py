"""Padding-free passes (actor.padding_free): a micro-batch's sequences packed end to end into one row.

verl's layout pads every row of a micro-batch to its longest prompt and response; a packed pass runs
only the real tokens through the linear layers (most of a small model's compute, and the memory of its
activations). Positions restart at 0 for each sequence (RoPE sees what it sees padded), and attention
stays inside each sequence: the model runs with attention "meshrl_packed", which is SDPA for padded
calls and, given the sequences' boundaries (cu_seq_lens_q, the names HF's own packed flash-attention
path reads), one batched causal SDPA over the sequences laid side by side again (the attention itself
is as padded as before; a varlen kernel, flash-attention's on CUDA, would cut that too). The
log-probs, values and gradients are the padded pass's (a test compares them); the head is computed
only at the positions that predict a response token.

Rows that share a prompt (a GRPO group) pack it once: the row holds each distinct prompt, then each
row's response, and a response attends to its prompt's keys and values and to its own (Shared), the
shared-prompt pass of services/actor/model.py without its padded responses or HF's cache.
"""

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "meshrl_packed"
PACKED = torch.zeros(1, 1, 0, 0, dtype=torch.bool)
"""The attention mask a packed call passes: 4-D, so HF's mask builders hand it on as it is instead of
building a (tokens x tokens) one; the attention below reads the boundaries instead."""


def attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """HF's attention interface: query (1, heads, tokens, dim), key and value (1, kv heads, tokens, dim)."""
    bounds, shared = kwargs.get("cu_seq_lens_q"), kwargs.get("meshrl_shared")
    if bounds is None and shared is None:  # a padded call (a value model's, generation's): SDPA
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1:
        key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    if shared is not None:
        return shared.attend(query[0], key[0], value[0], scaling), None
    assert bounds is not None
    # the sequences side by side again, each from its own start and padded on the right, for one batched
    # causal SDPA: a real token sees only its own sequence's earlier tokens, so no mask is needed, and the
    # padding's outputs are dropped (only the linear layers run padding-free)
    lengths = bounds.diff()
    width = int(kwargs.get("max_length_q") or lengths.max())
    place = torch.arange(width, device=query.device)
    index = (bounds[:-1, None] + place).clamp(max=query.shape[2] - 1)  # (sequences, width)
    q, k, v = (t[0][:, index].transpose(0, 1) for t in (query, key, value))  # (sequences, heads, width, dim)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling)
    real = place < lengths[:, None]
    return out.transpose(1, 2)[real][None], None  # (1, tokens, heads, dim)


AttentionInterface.register(NAME, attention)
AttentionMaskInterface.register(NAME, sdpa_mask)  # padded calls get SDPA's masks


def enable(model: torch.nn.Module) -> None:
    """Run the model's attention through `attention` (a model that cannot switch is refused)."""
    can = getattr(model, "_can_set_attn_implementation", None)
    if not callable(can) or not can():
        raise ValueError(f"actor.padding_free: {type(model).__name__} cannot switch its attention implementation")
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
        self.prompts = self.window(prompt_lengths, 0)  # (G, Wp) indices, real
        self.responses = self.window(response_lengths, self.prompt_tokens)  # (B, Wr)
        (p_index, p_real), (r_index, r_real) = self.prompts, self.responses
        self.keys = torch.cat([p_index[inverse], r_index], 1)  # (B, Wp + Wr): its prompt, then itself
        width = r_index.shape[1]
        causal = torch.ones(width, p_index.shape[1] + width, dtype=torch.bool, device=device)
        causal[:, p_index.shape[1] :] = torch.tril(causal[:, p_index.shape[1] :])
        self.mask = (torch.cat([p_real[inverse], r_real], 1)[:, None, :] & causal)[:, None]  # (B, 1, Wr, Wp+Wr)

    @staticmethod
    def window(lengths: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(sequences, longest) indices of each sequence's tokens from its own start, and which are real."""
        place = torch.arange(int(lengths.max()) if len(lengths) else 0, device=lengths.device)
        starts = start + F.pad(lengths.cumsum(0), (1, 0))[:-1]
        return starts[:, None] + place, place < lengths[:, None]

    def attend(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling) -> torch.Tensor:
        """(heads, tokens, dim) each -> (1, tokens, heads, dim)."""
        last = query.shape[1] - 1
        index, real = self.prompts
        q, k, v = (t[:, index.clamp(max=last)].transpose(0, 1) for t in (query, key, value))
        parts = [F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling).transpose(1, 2)[real]]
        index, real = self.responses
        if real.any():
            q = query[:, index.clamp(max=last)].transpose(0, 1)
            k, v = (t[:, self.keys.clamp(max=last)].transpose(0, 1) for t in (key, value))
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, scale=scaling)
            parts.append(out.transpose(1, 2)[real])
        return torch.cat(parts)[None]


def forward_packed_shared(model: torch.nn.Module, micro: dict, T: int, first: torch.Tensor, inverse: torch.Tensor):
    """What forward_response returns, (B, T, V), with each distinct prompt run once and every row's response
    padding-free, in one packed pass (the shared-prompt pass, services/actor/model.py, pads the responses)."""
    ids, mask, pos = micro["input_ids"], micro["attention_mask"], micro["position_ids"]
    P = ids.shape[1] - T
    prompt = mask[first, :P].bool()  # left-padded
    response = mask[:, P:-1].bool()  # right-padded; the last column predicts nothing
    lengths = prompt.sum(1)
    shared = Shared(lengths, response.sum(1), inverse)
    last = shared.prompts[0].gather(1, (lengths - 1)[:, None])[:, 0]  # each prompt's last token: the first
    read = torch.cat(
        [last, torch.arange(shared.prompt_tokens, shared.prompt_tokens + int(response.sum()), device=ids.device)]
    )
    out = model(
        input_ids=torch.cat([ids[first, :P][prompt], ids[:, P:-1][response]])[None],
        position_ids=torch.cat([pos[first, :P][prompt], pos[:, P:-1][response]])[None],
        attention_mask=PACKED.to(ids.device),
        use_cache=False,
        meshrl_shared=shared,
        logits_to_keep=read,
    ).logits[0]
    result = out.new_zeros((len(inverse), T, out.shape[-1]))
    result[:, 0] = out[: len(first)][inverse]
    result[:, 1:][response] = out[len(first) :]
    return result


def forward_packed(model: torch.nn.Module, micro: dict, T: int, head_only_where_read: bool) -> torch.Tensor:
    """What forward_response returns, (B, T, ...), from one packed row of the micro-batch's real tokens;
    zeros where a row's response is padding."""
    ids, mask, pos = micro["input_ids"], micro["attention_mask"], micro["position_ids"]
    keep = mask.bool()
    lengths = keep.sum(1)
    bounds = F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
    flat = (keep.flatten().cumsum(0) - 1).view(keep.shape)  # each real token's place in the packed row
    read = keep[:, -T - 1 : -1]  # positions whose output predicts a response token
    where = flat[:, -T - 1 : -1][read]
    out = model(
        input_ids=ids[keep][None],
        position_ids=pos[keep][None],
        attention_mask=PACKED.to(ids.device),
        use_cache=False,
        cu_seq_lens_q=bounds,
        cu_seq_lens_k=bounds,
        max_length_q=int(lengths.max()),
        max_length_k=int(lengths.max()),
        **({"logits_to_keep": where} if head_only_where_read else {}),
    ).logits[0]
    picked = out if head_only_where_read else out[where]
    result = picked.new_zeros((*read.shape, picked.shape[-1]))
    result[read] = picked
    return result
