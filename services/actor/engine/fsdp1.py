"""The FSDP1 engine: the classic FullyShardedDataParallel wrapper, one unit per transformer block.

Kept for parity with verl's FSDP backend; FSDP2 is the default. Full state
dicts are gathered without CPU offload here: with offload, gathering crashed
rank 0 on these machines (shared NOTES). A weight push gathers one FSDP unit at
a time (summon_full_params of that unit alone): a bucket never splits a
transformer block and each block is a unit, so no rank holds more than a
bucket's worth of full tensors, as with fsdp2.
"""

import operator

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import MixedPrecision
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from meshrl.models import layer_classes
from services.actor.engine.base import Engine

WRAPPED = "_fsdp_wrapped_module."


class FSDP1Engine(Engine):
    name = "fsdp1"
    module: FSDP  # what wrap builds

    def wrap(self, model: torch.nn.Module) -> FSDP:
        # FSDP1 flattens parameters into shards of a flat buffer: what a push announces (full shapes and
        # dtypes, module names) is read here, while the model is whole
        self.full_specs = {k: (v.dtype, v.shape) for k, v in model.state_dict().items()}
        mp = (
            MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, buffer_dtype=torch.float32)
            if self.cfg.mixed_precision
            else None
        )
        device_id = self.device  # on CPU too: without it FSDP1 looks for an accelerator and refuses
        module = FSDP(
            model,
            auto_wrap_policy=ModuleWrapPolicy(layer_classes(model)),
            mixed_precision=mp,
            device_id=device_id,
            use_orig_params=True,
        )
        # each unit under its HF prefix, and each name's unit: the longest prefix it has (a block's, else
        # the root's "")
        units = sorted(
            ((name.replace(WRAPPED, ""), m) for name, m in module.named_modules() if isinstance(m, FSDP)),
            key=lambda u: -len(u[0]),
        )
        self.unit_of = {n: next((p, m) for p, m in units if not p or n.startswith(p + ".")) for n in self.full_specs}
        return module

    def clip_grad_norm(self, max_norm: float) -> float:
        return float(self.module.clip_grad_norm_(max_norm))

    def full_state_options(self) -> StateDictOptions:
        return StateDictOptions(full_state_dict=True, cpu_offload=False)

    def weight_tensors(self) -> dict[str, torch.Tensor]:
        """Shapes and dtypes only (meta tensors): gather() reads the values unit by unit."""
        return {k: torch.empty(shape, dtype=dtype, device="meta") for k, (dtype, shape) in self.full_specs.items()}

    def gather(self, held: dict[str, torch.Tensor], names: list[str]) -> list[torch.Tensor]:
        """Each unit the names fall in, unsharded alone in turn (collective, the same order on every rank);
        copies of the named tensors, since the unit reshards on leaving."""
        by_unit: dict[str, list[str]] = {}
        for n in names:
            by_unit.setdefault(self.unit_of[n][0], []).append(n)
        out = {}
        for prefix, wanted in by_unit.items():
            unit = self.unit_of[wanted[0]][1]
            with FSDP.summon_full_params(unit, recurse=False, writeback=False):
                for n in wanted:
                    rel = n[len(prefix) + 1 :] if prefix else n
                    out[n] = operator.attrgetter(rel)(unit.module).detach().clone()
        return [out[n] for n in names]
