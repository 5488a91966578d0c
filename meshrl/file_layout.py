"""A model's tensors as its checkpoint files hold them, and as transformers holds them in memory.

transformers 5 converts some checkpoints when it loads them (its conversion mapping,
transformers/conversion_mapping.py): a mixture of experts' per-expert weights
(`mlp.experts.3.gate_proj.weight`, Mixtral's `block_sparse_moe.experts.3.w1.weight`) become one
3-d tensor per layer in memory (`mlp.experts.gate_up_proj`), and it converts them back when it saves.
A weight push speaks the files' names and shapes, which the rollout checks against the model folder
and vLLM's loader reads; the actor holds memory's, and so does the hf rollout backend. These two
functions go between them with transformers' own conversions, so every family it knows is mapped as it
maps it. For a model without conversions (the dense families) both are the identity.
"""

import copy
from typing import Any

import torch


def shell(config: Any):
    """The model of `config` on the meta device: the conversions to apply, no memory."""
    from meshrl.models import causal_class

    with torch.device("meta"):
        return causal_class(config).from_config(config)


def _transforms(model) -> tuple[list, list]:
    """(renamings, converters) in load order; both empty when the model loads its files as they are."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import PrefixChange, WeightConverter, WeightRenaming

    found = getattr(model, "_weight_conversions", None)
    if found is None:  # built from a config, not loaded: the family's mapping (as transformers saves it)
        found = [t for t in get_model_conversion_mapping(model, add_legacy=False) if not isinstance(t, PrefixChange)]
    renamings = [t for t in found if isinstance(t, WeightRenaming)]
    converters = [t for t in found if isinstance(t, WeightConverter)]
    return renamings, converters


def converts(model) -> bool:
    """Whether the model's tensors in memory differ from its files' (names or layout)."""
    renamings, converters = _transforms(model)
    return bool(renamings or converters)


def to_files(model, named: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Memory's tensors (any subset that converts on its own, e.g. one fused expert tensor, or meta tensors
    for the names and shapes alone) under the files' names, in the files' layout."""
    if not converts(model):
        return named
    from transformers.core_model_loading import revert_weight_conversion

    return revert_weight_conversion(model, dict(named))


def tied(model) -> set[str]:
    """The files' names of the model's tied weights (a head that is its embedding: Gemma-3's
    language_model.lm_head.weight, BioGPT's output_projection.weight): a push may carry them, as memory and
    state_dict() hold them, and the files do not."""
    keys = getattr(model, "all_tied_weights_keys", None) or {}
    return set(to_files(model, {k: torch.empty(0, device="meta") for k in keys}))


def to_memory(model, named: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The files' tensors (every part a memory tensor is made of, e.g. all of a layer's experts) under memory's
    names: transformers' load-time conversion without the loading. ValueError names a tensor whose parts are
    missing."""
    if not converts(model):
        return named
    from transformers.core_model_loading import WeightRenaming, dot_natural_key, rename_source_key

    renamings, converters = _transforms(model)
    by_pattern = {p: c for c in converters for p in c.source_patterns}
    pending: dict[str, Any] = {}
    for key, tensor in sorted(named.items(), key=lambda kv: dot_natural_key(kv[0])):
        target, pattern = rename_source_key(key, renamings, converters)
        if pattern is None:
            pending.setdefault(target, WeightRenaming(key, target)).add_tensor(target, key, key, tensor)
        else:
            pending.setdefault(target, copy.deepcopy(by_pattern[pattern])).add_tensor(target, key, pattern, tensor)
    out: dict[str, torch.Tensor] = {}
    for target, transform in pending.items():
        try:
            made = transform.convert(target, model=model, config=model.config)
        except Exception as e:  # transformers raises what the op raises (a stack of unequal parts, ...)
            raise ValueError(f"cannot assemble {target} from the tensors sent: {e}") from None
        for name, t in made.items():
            out[name] = t[0] if isinstance(t, list) else t
    return out
