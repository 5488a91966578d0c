"""Model loading and the per-token quantities the roles need from a forward pass.

The batch layout is verl's: input_ids = left-padded prompt + right-padded
response, so the logits that predict response token t sit at position
L - T - 1 + t (T = response length, L = sequence length).
"""

import torch
import torch.nn.functional as F

KINDS = ("causal", "value")


def load_model(path: str, kind: str) -> torch.nn.Module:
    """A causal LM, or a value model: the same body with a one-output token-classification head."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification

    if kind == "causal":
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    if kind == "value":
        # no dropout before the value head (HF's default is 0.1): values must be a function of the
        # weights, or a resumed run (fresh RNG) and the ranks (different masks) disagree
        config = AutoConfig.from_pretrained(path, num_labels=1)
        config.classifier_dropout = 0.0
        return AutoModelForTokenClassification.from_pretrained(path, config=config, dtype=torch.float32)
    raise ValueError(f"model kind must be one of {KINDS}, got {kind!r}")


def layer_classes(model: torch.nn.Module) -> set[type]:
    """The transformer block classes (HF names them in _no_split_modules): the units FSDP shards."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    classes = {type(m) for m in model.modules() if type(m).__name__ in names}
    if not classes:
        raise ValueError(f"cannot find the transformer blocks of {type(model).__name__} to shard")
    return classes


def forward_response(model: torch.nn.Module, micro: dict, response_length: int) -> torch.Tensor:
    """Model outputs at the positions that predict each response token: (B, T, V) or (B, T, 1)."""
    out = model(input_ids=micro["input_ids"], attention_mask=micro["attention_mask"],
                position_ids=micro["position_ids"], use_cache=False)
    return out.logits[:, -response_length - 1:-1]


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log p(token) under softmax(logits / temperature): (B, T, V), (B, T) -> (B, T), in fp32."""
    logp = F.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
