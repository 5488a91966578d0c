"""LoRA adapters on an engine's model (peft) and the names they travel under (the layers they go on: meshrl.models).

With lora_rank > 0 an engine wraps the loaded model with peft before sharding it: every target linear
layer gets lora_A (r x in) and lora_B (out x r, zero at first), the base weights are frozen, and only the
adapter (and a critic's value head, which peft keeps trained as a module to save) is in the optimizer.

The weights have three sets of names:
- the module's own state dict (peft's): `base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight`,
  `...q_proj.lora_A.default.weight`; the engines gather, shard and checkpoint these;
- the adapter as peft saves it (get_peft_model_state_dict): `...q_proj.lora_A.weight`; an adapter push and
  the exported adapter folder use these, which vLLM and PeftModel.from_pretrained read;
- the merged model under HF names (`model.layers.0.self_attn.q_proj.weight` = W + alpha/r * B @ A): a
  merge_lora push and the exported HF folder; computed from the gathered tensors on the way, so the
  trained weights are never touched.
A View maps each outgoing name to the module entries it is computed from.
"""

import copy
import dataclasses
import pathlib
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from meshrl.config.actor import EngineConfig
from meshrl.models import vision_tower
from meshrl.v1 import rollout_pb2

if TYPE_CHECKING:
    from peft import PeftModel

ADAPTER = "default"  # peft's name for the one adapter an engine trains
PREFIX = "base_model.model."  # what peft puts before the wrapped model's own names
TASKS = {"causal": "CAUSAL_LM", "value": "TOKEN_CLS"}  # TOKEN_CLS keeps the value head (score) trained


def add_adapter(
    model: torch.nn.Module, cfg: EngineConfig, kind: str, targets: list[str], parameters: Sequence[str] = ()
) -> "PeftModel":
    """The model with a fresh adapter on `targets` (target_modules) and on a mixture of experts' fused expert
    tensors `parameters` (target_parameters: peft's ParamWrapper, a rank-r pair per expert). lora_A's random
    start depends on the seed alone, so every engine (and every rank, and the meta-device copy of a sharded
    one) builds the same adapter."""
    from peft import LoraConfig, get_peft_model

    tower = vision_tower(model) if cfg.freeze_vision else None  # a frozen vision tower gets no adapter
    config = LoraConfig(
        task_type=TASKS[kind],
        r=cfg.lora_rank,
        # an int where it is one: peft annotates int, and adapter_config.json then reads as loaders expect
        lora_alpha=int(cfg.lora_alpha) if float(cfg.lora_alpha).is_integer() else cfg.lora_alpha,  # type: ignore[arg-type]
        lora_dropout=cfg.lora_dropout,
        target_modules=targets,
        target_parameters=list(parameters) or None,
        exclude_modules=None if tower is None else rf"{re.escape(tower)}\..*",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        return get_peft_model(model, config)


def peft_of(module: torch.nn.Module) -> "PeftModel":
    """The PeftModel inside an engine's module (FSDP1 wraps it; fully_shard keeps it as it is)."""
    from peft import PeftModel

    inner = module if isinstance(module, PeftModel) else getattr(module, "module", None)
    assert isinstance(inner, PeftModel), f"{type(module).__name__} holds no adapter"
    return inner


def scale(cfg: EngineConfig) -> float:
    return cfg.lora_alpha / cfg.lora_rank


def adapter_message(cfg: EngineConfig, targets: list[str]) -> rollout_pb2.LoraAdapter:
    """What BeginWeightUpdateRequest.lora tells a rollout about the adapter a push carries."""
    return rollout_pb2.LoraAdapter(rank=cfg.lora_rank, alpha=cfg.lora_alpha, target_modules=targets)


# ---- names ----------------------------------------------------------------------------------


def is_adapter(key: str) -> bool:
    """A module state-dict entry that the adapter holds (and a checkpoint and an adapter push carry)."""
    return ".lora_A." in key or ".lora_B." in key or ".modules_to_save." in key


def saved_name(key: str) -> str:
    """A module entry of the adapter under the name peft's save_pretrained writes."""
    return (
        key.replace(f".lora_A.{ADAPTER}.", ".lora_A.")
        .replace(f".lora_B.{ADAPTER}.", ".lora_B.")
        .replace(f".modules_to_save.{ADAPTER}.", ".")
    )


def hf_name(key: str) -> str:
    """A module entry of the base model (or a trained value head) under the wrapped model's own name (an
    expert tensor with two adapters sits under two base_layer levels)."""
    return re.sub(r"(\.base_layer)+\.", ".", key.removeprefix(PREFIX)).replace(f".modules_to_save.{ADAPTER}.", ".")


def expert_adapters(peft: torch.nn.Module) -> dict[str, tuple[str, str, str]]:
    """A mixture of experts' adapted fused tensors (peft's ParamWrapper, lora_experts): each one's module
    state-dict key -> its (lora_A, lora_B) keys and the layout of its merged update ("eoi": the tensor holds
    (experts, out, in), as transformers' experts do; "eio": (experts, in, out))."""
    from peft.tuners.lora.layer import ParamWrapper

    out: dict[str, tuple[str, str, str]] = {}
    for name, wrapper in peft.named_modules():
        if not isinstance(wrapper, ParamWrapper):
            continue
        base: torch.nn.Module = wrapper
        path = name
        while isinstance(base, ParamWrapper):  # two tensors of one module: one wrapper inside the other
            base, path = base.base_layer, f"{path}.base_layer"
        key = f"{path}.{wrapper.parameter_name}"
        layout = "eio" if getattr(base, "is_transposed", False) else "eoi"  # peft's rule (ParamWrapper.update_layer)
        out[key] = (f"{name}.lora_A.{ADAPTER}.weight", f"{name}.lora_B.{ADAPTER}.weight", layout)
    return out


@dataclasses.dataclass
class View:
    """Tensors under the names a reader expects, each computed from module state-dict entries."""

    sources: dict[str, tuple[str, ...]]  # name -> one entry (sent as it is) or (W, lora_A, lora_B): merged
    scale: float = 1.0
    layouts: dict[str, str] = dataclasses.field(default_factory=dict)  # a merged fused expert tensor's ("eoi")

    def compute(self, name: str, tensors: list[torch.Tensor]) -> torch.Tensor:
        if len(tensors) == 1:
            return tensors[0]
        w, a, b = tensors
        if w.dim() == 3:  # an expert pair per expert: A (r * E, in), B (out, r * E), as peft lays them out
            E = w.shape[0]
            pairs = b.reshape(b.shape[0], -1, E), a.reshape(E, -1, a.shape[-1])
            return w + torch.einsum(f"ore,eri->{self.layouts[name]}", *pairs) * self.scale
        return w + (b @ a) * self.scale  # peft's merge, the same operations: (out, r) @ (r, in)


def model_view(keys: list[str]) -> View:
    return View({k: (k,) for k in keys})


def adapter_view(keys: list[str]) -> View:
    return View({saved_name(k): (k,) for k in keys if is_adapter(k)})


def merged_view(keys: list[str], lora_scale: float, experts: dict[str, tuple[str, str, str]] | None = None) -> View:
    """experts: expert_adapters() of the model (lora_experts), merged per expert."""
    sources: dict[str, tuple[str, ...]] = {}
    layouts: dict[str, str] = {}
    for k in keys:
        if ".lora_A." in k or ".lora_B." in k or ".original_module." in k:  # the head's frozen copy: not used
            continue
        if experts and k in experts:
            a, b, layouts[hf_name(k)] = experts[k]
            sources[hf_name(k)] = (k, a, b)
        elif k.endswith(".base_layer.weight"):
            stem = k.removesuffix("base_layer.weight")
            sources[hf_name(k)] = (k, f"{stem}lora_A.{ADAPTER}.weight", f"{stem}lora_B.{ADAPTER}.weight")
        else:
            sources[hf_name(k)] = (k,)
    return View(sources, lora_scale, layouts)


def computed(view: View, held: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every tensor of the view from entries held whole."""
    return {name: view.compute(name, [held[k] for k in keys]) for name, keys in view.sources.items()}


def save_adapter(path: pathlib.Path, peft: "PeftModel", base: str, tensors: dict[str, torch.Tensor]) -> None:
    """A peft adapter folder (adapter_config.json, adapter_model.safetensors) that PeftModel.from_pretrained
    and vLLM's LoRA loader read; `tensors` under their saved names, whole."""
    from safetensors.torch import save_file

    config = copy.copy(peft.peft_config[ADAPTER])
    config.inference_mode = True  # as peft's own save_pretrained writes it
    config.base_model_name_or_path = base
    path.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(str(path))
    save_file(
        {k: v.detach().cpu().contiguous() for k, v in tensors.items()},
        str(path / "adapter_model.safetensors"),
        metadata={"format": "pt"},
    )
