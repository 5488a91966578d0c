"""The FSDP1 engine: the classic FullyShardedDataParallel wrapper, one unit per transformer block.

Kept for parity with verl's FSDP backend; FSDP2 is the default. Full state
dicts are gathered without CPU offload here: with offload, gathering crashed
rank 0 on these machines (shared NOTES). A weight push gathers the whole model
at once here (FSDP1 shards flat parameters, not tensors); fsdp2 gathers a bucket
at a time.
"""

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import MixedPrecision
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from services.actor.engine.base import Engine
from services.actor.model import layer_classes


class FSDP1Engine(Engine):
    name = "fsdp1"

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        mp = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, buffer_dtype=torch.float32) \
            if self.cfg.mixed_precision else None
        device_id = self.device  # on CPU too: without it FSDP1 looks for an accelerator and refuses
        return FSDP(model, auto_wrap_policy=ModuleWrapPolicy(layer_classes(model)), mixed_precision=mp,
                    device_id=device_id, use_orig_params=True)

    def clip_grad_norm(self, max_norm: float) -> float:
        return float(self.module.clip_grad_norm_(max_norm))

    def full_state_options(self) -> StateDictOptions:
        return StateDictOptions(full_state_dict=True, cpu_offload=False)

    def weight_tensors(self) -> dict[str, torch.Tensor]:
        return get_model_state_dict(self.module, options=self.full_state_options())
