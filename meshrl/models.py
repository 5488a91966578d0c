"""What a HuggingFace model folder builds into, for every service that builds one: the model (a causal LM or
a value model, dropout off), the same on the meta device, its transformer blocks, and the linear layers a
LoRA adapter goes on (checked here so a run refuses a bad adapter before any service starts).
"""

import functools
import logging
import pathlib
from typing import TYPE_CHECKING, TypeVar

import torch

from meshrl.config.actor import ALL_LINEAR, EngineSettings, lora_targets
from meshrl.moe_facts import facts

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
    from transformers import AutoConfig, AutoModelForTokenClassification

    if kind not in KINDS:
        raise ValueError(f"model kind must be one of {KINDS}, got {kind!r}")
    config = AutoConfig.from_pretrained(path, **({"num_labels": 1} if kind == "value" else {}))
    if not dropout:
        zero_dropout_config(config)
    return (causal_class(config) if kind == "causal" else AutoModelForTokenClassification), config


def causal_class(config):
    """transformers' auto class for a causal LM of this config: a vision-language model's takes pictures too."""
    import transformers

    from meshrl.modalities.vision import is_vision

    return transformers.AutoModelForImageTextToText if is_vision(config) else transformers.AutoModelForCausalLM


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


TOWERS = ("visual", "vision_tower", "vision_model")  # what vision-language models call their vision encoder


def vision_tower(model: torch.nn.Module) -> str | None:
    """The dotted name of a vision-language model's vision encoder (Qwen2-VL's model.visual), None for a
    language model."""
    return next((n for n, _ in model.named_modules() if n.rsplit(".", 1)[-1] in TOWERS), None)


def layer_classes(model: torch.nn.Module) -> set[type]:
    """The transformer block classes (HF names them in _no_split_modules): the units FSDP shards."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    classes = {type(m) for m in model.modules() if type(m).__name__ in names}
    if not classes:
        raise ValueError(f"cannot find the transformer blocks of {type(model).__name__} to shard")
    return classes


def weight_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and persistent buffer by state_dict name, the tensors themselves: what a weight push
    fills. A persistent buffer (the router's e_score_correction_bias of DeepSeek-V3, GLM-4.5, dots1,
    MiniMax-M2) is in the model's files and in a push, not in named_parameters()."""
    return dict(model.state_dict(keep_vars=True))


def expert_tensors(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """A mixture of experts' fused expert tensors by name (3-d: one slice per expert, as transformers holds
    them in memory); {} for a dense model."""
    return {n: p for n, p in model.named_parameters() if p.dim() == 3 and ".experts" in n}


def fused_experts(model: torch.nn.Module) -> list[str]:
    """The names of the fused expert tensors (expert_tensors), e.g. ["down_proj", "gate_up_proj"]."""
    return sorted({n.rsplit(".", 1)[-1] for n in expert_tensors(model)})


def is_moe(config) -> bool:
    """Whether a config (a transformers config, a config.json's dict or a namespace of one) is a mixture of
    experts' (meshrl/moe_facts.py reads its spellings)."""
    return facts(config) is not None


def lora_target_modules(model: torch.nn.Module, cfg: EngineSettings) -> list[str]:
    """The names (as peft matches them: the end of a module's name) of the linear layers that get an
    adapter; ValueError in one line for targets the model lacks, layers that are not linear, or a rank
    larger than a target's smaller dimension."""
    config = getattr(model, "config", None)
    if getattr(config, "is_encoder_decoder", False):
        raise ValueError(f"lora_rank > 0: LoRA here is for decoder-only models; {type(model).__name__} is not one")
    spec = lora_targets(cfg.lora_target_modules)
    tower = vision_tower(model)
    frozen = cfg.freeze_vision and tower is not None  # no adapter inside it (lora.add_adapter excludes it)
    linear = {name: m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    if spec == [ALL_LINEAR]:
        experts = fused_experts(model)
        if experts and not cfg.lora_experts:
            raise ValueError(
                f"lora_target_modules=all-linear: {type(model).__name__}'s experts ({', '.join(experts)}) are not "
                "linear layers, and neither is its router: an adapter would train its attention alone. Set "
                "actor.lora_experts=true to adapt the experts too, or name the layers to adapt to train those "
                "alone (e.g. q_proj,k_proj,v_proj,o_proj)"
            )
        blocks = layer_classes(model)  # ValueError when the model's blocks cannot be found
        in_blocks = [(name, b) for name, b in model.named_modules() if type(b) in blocks]
        # a vision tower's blocks by their last two names (attn.proj: its patch embedding is a `proj` too,
        # a convolution), none of them when the tower is frozen
        names = sorted(
            {
                ".".join(n.split(".")[-(2 if inside(name, tower) else 1) :])
                for name, b in in_blocks
                if not (frozen and inside(name, tower))
                for n, m in b.named_modules()
                # not a one-output gate (Qwen2-MoE's shared_expert_gate): no rank fits it
                if isinstance(m, torch.nn.Linear) and m.out_features > 1
            }
        )
        if not names:
            raise ValueError(f"lora_target_modules=all-linear: {type(model).__name__}'s blocks have no linear layer")
    else:
        names = spec
    check_lora_targets(model, cfg, names, linear, tower if frozen else None)
    return names


def check_lora_targets(model, cfg: EngineSettings, names: list[str], linear: dict, frozen_tower) -> None:
    """ValueError in one line for a target the model lacks (outside a frozen tower), one that is not a
    linear layer, or a rank larger than a target's smaller dimension."""
    known = sorted({n.rsplit(".", 1)[-1] for n in linear})
    for target in names:
        matched = [
            n
            for n, _ in model.named_modules()
            if (n == target or n.endswith("." + target)) and not inside(n, frozen_tower)
        ]
        if not matched:
            raise ValueError(
                f"lora_target_modules: {type(model).__name__} has no module named {target!r} (its linear layers: "
                f"{', '.join(known)})"
            )
        for n in matched:
            layer = linear.get(n)
            if layer is None:
                kind = type(model.get_submodule(n)).__name__
                raise ValueError(f"lora_target_modules: {n} ({kind}) is not a linear layer")
            if cfg.lora_rank > min(layer.in_features, layer.out_features):
                raise ValueError(
                    f"lora_rank={cfg.lora_rank} is larger than {n} ({layer.out_features} x {layer.in_features}) "
                    "allows: at most its smaller dimension"
                )


def inside(name: str, tower: str | None) -> bool:
    return tower is not None and name.startswith(tower + ".")


def lora_target_parameters(model: torch.nn.Module, cfg: EngineSettings) -> list[str]:
    """With lora_experts: the fused expert tensors that get an adapter, as peft's target_parameters name them
    (the experts module's own name and the tensor's, e.g. ["experts.down_proj", "experts.gate_up_proj"]);
    [] without. ValueError in one line on a dense model or a rank larger than an expert's matrix allows."""
    if not cfg.lora_experts:
        return []
    fused = expert_tensors(model)
    if not fused:
        raise ValueError(f"lora_experts=true: {type(model).__name__} is not a mixture of experts (no fused experts)")
    for n, p in fused.items():
        if cfg.lora_rank > min(p.shape[1:]):
            raise ValueError(
                f"lora_rank={cfg.lora_rank} is larger than each expert of {n} ({p.shape[1]} x {p.shape[2]}) allows"
            )
    return sorted({".".join(n.split(".")[-2:]) for n in fused})


def check_lora(model_path: str, kind: str, cfg: EngineSettings) -> list[str]:
    """lora_target_modules of the model at model_path, built on the meta device (no weights read): a run
    refuses a bad adapter before any service starts, and the actor service before any rank starts (the
    expert tensors lora_experts adds are checked too)."""
    model = empty_model(model_path, kind, cfg.dropout)
    lora_target_parameters(model, cfg)
    return lora_target_modules(model, cfg)


@functools.lru_cache(maxsize=8)
def generation_config(model_dir: str):
    """The model folder's generation settings (its end tokens, e.g.) as transformers loads them with the
    model: generation_config.json, else what config.json says; None where the folder has neither."""
    from transformers import AutoConfig, GenerationConfig

    folder = pathlib.Path(model_dir) if model_dir else None  # never a hub id: nothing is downloaded here
    if folder is not None and (folder / "generation_config.json").is_file():
        return GenerationConfig.from_pretrained(model_dir)
    if folder is not None and (folder / "config.json").is_file():
        return GenerationConfig.from_model_config(AutoConfig.from_pretrained(model_dir))
    return None


def end_ids(tokenizer, generation_config=None) -> list[int]:
    """Every token that ends a response: the tokenizer's eos and the generation config's eos ids (one or a
    list: Qwen2.5's <|im_end|> and <|endoftext|>), as vLLM honours them."""
    ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    extra = getattr(generation_config, "eos_token_id", None)
    for i in [extra] if isinstance(extra, int) else extra or []:
        if i not in ids:
            ids.append(i)
    return ids
