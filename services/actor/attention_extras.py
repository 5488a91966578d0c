"""What a model's attention layer adds to causal attention within a sequence, and attention that applies it.

The packed passes (services/actor/packing.py) run a model's layers through our attention function, so
what the layer's own attention would do beyond causal softmax attention must be done there too, or the
packed pass is another model: gpt-oss's attention sinks (`s_aux=self.sinks`: a per-head logit that takes
softmax mass and adds no value), Gemma-2's logit soft-cap (`softcap`), a layer's sliding window
(`sliding_window`; or, where a model applies it by its masks alone, its config's `layer_types`), Llama-4's
chunked layers (`attention_chunk_size`, masks only). The math is the models' own eager attention's
(e.g. transformers' models/gpt_oss/modeling_gpt_oss.eager_attention_forward); a keyword the packed
attention does not know is refused (Extras.of), never dropped.
"""

import dataclasses

import torch
import torch.nn.functional as F

IGNORED = frozenset(
    {
        # the packed call's own: the rows' boundaries (HF's names) and meshrl's layouts
        "cu_seq_lens_q",
        "cu_seq_lens_k",
        "max_length_q",
        "max_length_k",
        "meshrl_shared",
        "meshrl_sp",
        "meshrl_tokens",
        # what models hand on to every layer and attention does not read
        "position_ids",
        "use_cache",
        "output_router_logits",
        "output_hidden_states",
        "num_items_in_batch",
        "logits_to_keep",  # a vision-language model's forward hands its own on to the language model's layers
    }
)
HONOURED = frozenset({"sliding_window", "s_aux", "softcap", "is_causal", "output_attentions"})


@dataclasses.dataclass(frozen=True)
class Extras:
    """One layer's additions to causal attention within each sequence (positions from its start)."""

    window: int | None = None  # a query sees keys fewer than `window` positions back (kv > q - window)
    chunk: int | None = None  # a query sees keys of its own chunk of `chunk` positions only
    sinks: torch.Tensor | None = None  # (heads,): one more logit per head, in the softmax, with no value
    softcap: float | None = None  # logits -> softcap * tanh(logits / softcap), before the mask
    dropout: float = 0.0  # on the attention probabilities (the model passes 0 unless it trains with it)

    @classmethod
    def of(cls, module: torch.nn.Module, kwargs: dict, dropout: float) -> "Extras":
        """What `module`'s call to the attention interface asks for; ValueError for what it cannot give."""
        name = type(module).__name__
        unknown = sorted(k for k, v in kwargs.items() if v is not None and k not in IGNORED | HONOURED)
        if unknown:
            raise ValueError(
                f"actor.padding_free: {name} passes {', '.join(unknown)} to its attention, which the packed "
                "attention does not apply (set actor.padding_free=false for this model)"
            )
        if kwargs.get("is_causal") is False or kwargs.get("output_attentions"):
            raise ValueError(
                f"actor.padding_free: {name} asks for bidirectional attention or the attention weights, which "
                "the packed attention does not give"
            )
        window, chunk = kwargs.get("sliding_window"), None
        config, index = getattr(module, "config", None), getattr(module, "layer_idx", None)
        kinds = getattr(config, "layer_types", None)
        kind = kinds[index] if kinds is not None and index is not None and index < len(kinds) else None
        if kind == "sliding_attention" and window is None:  # a model that applies it by its masks alone
            window = getattr(config, "sliding_window", None)
        if kind == "chunked_attention":
            chunk = getattr(config, "attention_chunk_size", None)
        return cls(window or None, chunk or None, kwargs.get("s_aux"), kwargs.get("softcap"), float(dropout or 0.0))

    def within(self, longest: int) -> "Extras":
        """The same, less a window or chunk that no sequence of `longest` tokens reaches past."""
        window = self.window if self.window is not None and longest > self.window else None
        chunk = self.chunk if self.chunk is not None and longest > self.chunk else None
        return dataclasses.replace(self, window=window, chunk=chunk)

    def kernel_window(self) -> tuple[int, int] | None:
        """flash-attention's window_size for this layer (causal: (-1, 0)), or None where its varlen kernel
        cannot compute it (sinks, soft-caps, chunks, dropout): the caller lays the sequences side by side."""
        if self.sinks is not None or self.softcap is not None or self.chunk is not None or self.dropout:
            return None
        return (-1, 0) if self.window is None else (self.window - 1, 0)

    def masked(self) -> bool:
        """A mask beyond causality is needed (a window or a chunk within reach)."""
        return self.window is not None or self.chunk is not None

    def allowed(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """Which keys each query sees, from their positions in their sequence (broadcast: q_pos (..., Wq, 1),
        k_pos (..., 1, Wk)): causal, then the window and chunk as transformers' masks (masking_utils)."""
        seen = k_pos <= q_pos
        if self.window is not None:
            seen = seen & (k_pos > q_pos - self.window)
        if self.chunk is not None:
            seen = seen & (k_pos // self.chunk == q_pos // self.chunk)
        return seen

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scaling):
        """(n, heads, Wq, dim) queries over (n, heads, Wk, dim) keys and values -> (n, heads, Wq, dim). mask:
        bool (n or 1, 1, Wq, Wk), True where a query sees a key; None: causal."""
        if self.sinks is None and self.softcap is None:
            causal = mask is None
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=self.dropout, is_causal=causal, scale=scaling
            )
        if mask is None:
            mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril(k.shape[2] - q.shape[2])
        scale = scaling if scaling is not None else q.shape[-1] ** -0.5
        logits = torch.matmul(q, k.transpose(-1, -2)) * scale  # (n, heads, Wq, Wk)
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        logits = logits.masked_fill(~mask, torch.finfo(logits.dtype).min)
        if self.sinks is not None:
            sink = self.sinks.to(logits.dtype).reshape(1, -1, 1, 1).expand(*logits.shape[:-1], 1)
            logits = torch.cat([logits, sink], -1)
        probs = logits.softmax(-1)
        if self.sinks is not None:
            probs = probs[..., :-1]  # the sink's mass, dropped with its (absent) value
        probs = F.dropout(probs, self.dropout, training=self.dropout > 0)
        return torch.matmul(probs.to(v.dtype), v)
