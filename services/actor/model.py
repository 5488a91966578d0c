"""Model loading and the per-token quantities the roles need from a forward pass.

The batch layout is verl's: input_ids = left-padded prompt + right-padded
response, so the logits that predict response token t sit at position
L - T - 1 + t (T = response length, L = sequence length).
"""

import logging
from typing import TYPE_CHECKING, TypeVar

import torch
import torch.nn.functional as F

if TYPE_CHECKING:  # transformers is imported where a model is built, not with this module
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification, PretrainedConfig, PreTrainedModel

log = logging.getLogger(__name__)
KINDS = ("causal", "value")
M = TypeVar("M", bound=torch.nn.Module)


def load_model(path: str, kind: str, dropout: bool = False) -> "PreTrainedModel":
    """A causal LM, or a value model: the same body with a one-output token-classification head.

    Dropout is off unless asked for: log-probs, values and the PPO ratio must be functions of the
    weights (a first on-policy epoch has ratio 1, ranks and a resumed run agree). HF models keep
    dropout rates in their config (attention_dropout, resid_pdrop, classifier_dropout, ...), so the
    rates are zeroed there and on every Dropout module; the model still trains in train mode, which
    gradient checkpointing needs.
    """
    cls, config = model_class(path, kind, dropout)
    if kind != "value":
        return without_dropout(cls.from_pretrained(path, config=config, dtype=torch.float32), dropout)
    # A value head on an LM checkpoint: the head is new and the LM head unused, as intended, so transformers'
    # warning table of both (the red "LOAD REPORT") would only alarm; one line says the same.
    loader = logging.getLogger("transformers.modeling_utils")
    level = loader.level
    loader.setLevel(logging.ERROR)
    try:
        # output_loading_info=True: (model, info), which transformers' annotation of the return leaves out
        model, info = cls.from_pretrained(  # type: ignore[misc]
            path, config=config, dtype=torch.float32, output_loading_info=True
        )
    finally:
        loader.setLevel(level)
    log.info(
        "value model from %s: new %s, unused %s",
        path,
        sorted(info.get("missing_keys", [])),
        sorted(info.get("unexpected_keys", [])),
    )
    return without_dropout(model, dropout)


def empty_model(path: str, kind: str, dropout: bool = False) -> "PreTrainedModel":
    """The model load_model builds, on the meta device: its shapes, types and tied weights, no memory.
    Sharded engines build this on every rank and fill their shards from rank 0's one loaded copy."""
    cls, config = model_class(path, kind, dropout)
    with torch.device("meta"):
        return without_dropout(cls.from_config(config, dtype=torch.float32), dropout)


def model_class(
    path: str, kind: str, dropout: bool
) -> tuple[type["AutoModelForCausalLM"] | type["AutoModelForTokenClassification"], "PretrainedConfig"]:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification

    if kind not in KINDS:
        raise ValueError(f"model kind must be one of {KINDS}, got {kind!r}")
    config = AutoConfig.from_pretrained(path, **({"num_labels": 1} if kind == "value" else {}))
    if not dropout:
        zero_dropout_config(config)
    return (AutoModelForCausalLM if kind == "causal" else AutoModelForTokenClassification), config


def without_dropout(model: M, dropout: bool) -> M:
    if not dropout:
        for m in model.modules():
            if isinstance(m, torch.nn.Dropout):
                m.p = 0.0
    return model


def zero_dropout_config(config) -> None:
    """Every dropout rate of a HF config (and its sub-configs) to 0."""
    for key, value in list(vars(config).items()):
        if isinstance(value, float) and ("dropout" in key or key.endswith("pdrop")):
            setattr(config, key, 0.0)
        elif hasattr(value, "to_dict") and value is not config:  # text_config of a multimodal config
            zero_dropout_config(value)
    # absent or None, token-classification heads fall back to their own default (0.1 in Llama's)
    config.classifier_dropout = 0.0


def layer_classes(model: torch.nn.Module) -> set[type]:
    """The transformer block classes (HF names them in _no_split_modules): the units FSDP shards."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    classes = {type(m) for m in model.modules() if type(m).__name__ in names}
    if not classes:
        raise ValueError(f"cannot find the transformer blocks of {type(model).__name__} to shard")
    return classes


def forward_response(
    model: torch.nn.Module, micro: dict, response_length: int | None = None, share_prompts: bool = False
) -> torch.Tensor:
    """Model outputs at the positions that predict each response token: (B, T, V) or (B, T, 1); T is the
    micro-batch's own response width unless given.

    share_prompts (causal LMs only): rows with the same prompt (a GRPO group's n samples, a DPO pair) run
    it once, and their responses attend to its cached keys and values (Prefix Grouper, arXiv:2506.05433).
    Causal attention makes a prompt's states independent of what follows, so the outputs are the same
    and the gradients sum over the rows, as the full pass's do; the prompt's share of the compute falls by
    the number of rows that share it. A causal LM also computes its head only where it is read."""
    T = micro["responses"].shape[1] if response_length is None else response_length
    if share_prompts and not getattr(model, "is_gradient_checkpointing", False):  # HF drops the cache then
        shared = prompt_sharing(micro, T)
        if shared is not None:
            return forward_shared(model, micro, T, *shared)
    kw = {"logits_to_keep": T + 1} if share_prompts else {}
    out = model(
        input_ids=micro["input_ids"],
        attention_mask=micro["attention_mask"],
        position_ids=micro["position_ids"],
        use_cache=False,
        **kw,
    )
    return out.logits[:, -T - 1 : -1]


def prompt_sharing(micro: dict, T: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(one row of each distinct prompt, each row's index into those), or None when too few rows share
    one for a second pass to pay (fewer than a quarter of the prompts saved)."""
    inverse = prompt_index(micro, T)
    rows, distinct = len(inverse), int(inverse.max()) + 1
    if distinct * 4 > rows * 3:
        return None
    first = torch.full((distinct,), rows, device=inverse.device).scatter_reduce(
        0, inverse, torch.arange(rows, device=inverse.device), "amin"
    )
    return first, inverse


def prompt_index(tensors: dict, T: int) -> torch.Tensor:
    """Each row's prompt (ids, mask and positions before the last T columns) as an index into the
    distinct ones."""
    P = tensors["input_ids"].shape[1] - T
    key = torch.cat([tensors[k][:, :P] for k in ("input_ids", "attention_mask", "position_ids")], 1)
    return torch.unique(key, dim=0, return_inverse=True)[1]


def forward_shared(
    model: torch.nn.Module, micro: dict, T: int, first: torch.Tensor, inverse: torch.Tensor
) -> torch.Tensor:
    ids, mask, pos = micro["input_ids"], micro["attention_mask"], micro["position_ids"]
    P = ids.shape[1] - T
    prompt = model(
        input_ids=ids[first, :P],
        attention_mask=mask[first, :P],
        position_ids=pos[first, :P],
        use_cache=True,
        logits_to_keep=1,
    )
    last = prompt.logits[inverse]  # the last prompt position predicts the first response token
    if T == 1:
        return last
    cache = prompt.past_key_values
    cache.batch_select_indices(inverse)  # an indexing op: the gradient flows back to the shared prompt
    rest = model(
        input_ids=ids[:, P:-1],
        attention_mask=mask[:, :-1],
        position_ids=pos[:, P:-1],
        past_key_values=cache,
        use_cache=True,
    )
    return torch.cat([last, rest.logits], 1)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log p(token) under softmax(logits / temperature): (B, T, V), (B, T) -> (B, T), in fp32."""
    logp = F.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
