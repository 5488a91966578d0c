"""What a mixture of experts is, in one place: its experts, top-k and MoE layers from its config, and its
routers from its modules.

Families spell the same facts differently (NOTES.md, "Model families beyond the first ones"): experts
`num_experts` / `num_local_experts` / `n_routed_experts` (DeepSeek-V3, GLM-4.5, dots1) / `moe_num_experts`
(ERNIE-4.5); top-k `num_experts_per_tok` / `moe_topk` (Hunyuan) / `moe_k` (ERNIE-4.5); dense layers
`first_k_dense_replace` (DeepSeek-V3, GLM-4.5), `decoder_sparse_step` and `mlp_only_layers` (Qwen),
`moe_layer_start_index` / `moe_layer_end_index` / `moe_layer_interval` (ERNIE-4.5), `moe_layers`
(Llama-4); a vision-language model keeps them in `text_config`. facts() reads a config.json's dict, a
transformers config or a namespace of either. A router is found by where it sits, the MoE block's `gate`
or `router` beside its `experts`, not by its class name (DeepseekV3TopkRouter, Llama4Router,
HunYuanMoEV1Gate).
"""

import dataclasses
from typing import Any

import torch

EXPERTS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
TOP_K = ("num_experts_per_tok", "moe_topk", "moe_k", "num_experts_per_token")
ROUTER_NAMES = ("gate", "router")  # the MoE block's child that routes, beside `experts`


@dataclasses.dataclass(frozen=True)
class Facts:
    num_experts: int  # routed experts per MoE layer (shared experts apart)
    top_k: int  # experts each token is routed to
    layers: tuple[int, ...]  # the decoder layers that are MoE, ascending


def values_of(config: Any) -> dict:
    """The language model's config as a dict: a config.json's, a transformers config's (to_dict: its own
    attribute names) or a namespace's; a vision-language model's text_config."""
    if not isinstance(config, dict):
        config = config.to_dict() if hasattr(config, "to_dict") else dict(vars(config))
    text = config.get("text_config")
    if text is not None and not isinstance(text, dict):
        text = values_of(text)
    return text or config


def first(values: dict, names: tuple[str, ...]):
    return next((values[n] for n in names if values.get(n) is not None), None)


def one(value, what: str) -> int:
    """An int, or a per-layer list of equal ints (Hunyuan may give lists); ValueError for unequal ones."""
    if isinstance(value, (list, tuple)):
        if len(set(value)) != 1:
            raise ValueError(f"the model's {what} differs per layer ({list(value)}), which meshrl does not take")
        value = value[0]
    return int(value)


def facts(config: Any) -> Facts | None:
    """The mixture of experts' facts of a config, None for a dense model (no experts named, or 0); ValueError
    for experts without a top-k."""
    values = values_of(config)
    experts = first(values, EXPERTS)
    if not experts or (isinstance(experts, (list, tuple)) and not any(experts)):
        return None
    k = first(values, TOP_K)
    if k is None:
        raise ValueError(f"the model's config names {experts} experts but no top-k (one of {', '.join(TOP_K)})")
    return Facts(one(experts, "number of experts"), one(k, "top-k"), moe_layers(values))


def moe_layers(values: dict) -> tuple[int, ...]:
    """The MoE layers of a (text) config dict, as the families' decoder layers choose their MLP."""
    n = int(values["num_hidden_layers"])
    if values.get("moe_layers") is not None:  # Llama-4 lists them
        return tuple(sorted(int(i) for i in values["moe_layers"]))
    if values.get("interleave_moe_layer_step"):  # Llama-4 without the list: every step-th layer
        step = int(values["interleave_moe_layer_step"])
        return tuple(range(step - 1, n, step))
    dense = set(values.get("mlp_only_layers") or ())  # Qwen
    step = int(values.get("decoder_sparse_step") or 1)  # Qwen: layers i with (i + 1) % step == 0
    start = int(values.get("first_k_dense_replace") or 0)  # DeepSeek-V3, GLM-4.5, dots1: the first k dense
    freq = int(values.get("moe_layer_freq") or 1)  # DeepSeek's own code (and vLLM): i % freq == 0
    interval = int(values.get("moe_layer_interval") or 1)  # ERNIE-4.5: (i + 1) % interval == 0 in [start, end]
    start = max(start, int(values.get("moe_layer_start_index") or 0))
    end = values.get("moe_layer_end_index")
    end = n - 1 if end is None or int(end) < 0 else int(end)
    return tuple(
        i
        for i in range(start, min(n, end + 1))
        if i not in dense and (i + 1) % step == 0 and i % freq == 0 and (i + 1) % interval == 0
    )


def routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's MoE routers in layer order: each MoE block's `gate` or `router`, the child beside its
    `experts`; [] for a dense model."""
    found = []
    for module in model.modules():
        children = dict(module.named_children())
        if "experts" in children:
            router = next((children[n] for n in ROUTER_NAMES if n in children), None)
            if router is not None:
                found.append(router)
    return found
