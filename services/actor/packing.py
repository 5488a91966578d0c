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
    bounds = kwargs.get("cu_seq_lens_q")
    if bounds is None:  # a padded call (the shared-prompt pass with its cache, a value model's): SDPA
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1:
        key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
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
