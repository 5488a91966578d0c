"""The FSDP2 engine (fully_shard): each transformer block and the root sharded over the group.

With hsdp_replicate > 1 the device mesh is 2-D (replicate x shard): HSDP, which
shards within groups of world/replicate ranks and replicates across them.
"""

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from meshrl.models import layer_classes
from services.actor.engine.base import Engine


class FSDP2Engine(Engine):
    name = "fsdp2"
    rank0_loads = True

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        world, rep = dist.get_world_size(), self.cfg.hsdp_replicate
        if world % rep:
            raise ValueError(f"hsdp_replicate {rep} does not divide the world size {world}")
        if rep > 1:
            mesh = init_device_mesh(self.device.type, (rep, world // rep), mesh_dim_names=("replicate", "shard"))
        else:
            mesh = init_device_mesh(self.device.type, (world,), mesh_dim_names=("shard",))
        mp = (
            MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            if self.cfg.mixed_precision
            else MixedPrecisionPolicy()
        )
        blocks = layer_classes(model)
        for module in model.modules():
            if type(module) in blocks:
                fully_shard(module, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        return model

    def wrap_from_rank0(self, model: torch.nn.Module, full: torch.nn.Module | None) -> torch.nn.Module:
        # sharded on the meta device, then given memory for its shards only; rank 0 broadcasts one full
        # tensor at a time and each rank keeps its shard (verl's and torchtitan's meta-device init)
        module = self.wrap(model)
        module.to_empty(device=self.device)
        set_model_state_dict(
            module,
            full.state_dict() if full is not None else {},
            options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
        )
        broadcast_unsaved_buffers(module, full)
        return module


def broadcast_unsaved_buffers(module: torch.nn.Module, full: torch.nn.Module | None) -> None:
    """Buffers outside the state dict (rotary inv_freq, ...) are computed at construction, which the meta
    device skipped: rank 0's values, copied to every rank. Collective."""
    saved = set(module.state_dict())
    source = dict(full.named_buffers()) if full is not None else {}
    for name, buf in module.named_buffers():
        if name not in saved:
            if full is not None:
                buf.copy_(source[name])
            dist.broadcast(buf, src=0)
