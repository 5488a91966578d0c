"""The FSDP2 engine (fully_shard): each transformer block and the root sharded over the group.

With hsdp_replicate > 1 the device mesh is 2-D (replicate x shard): HSDP, which
shards within groups of world/replicate ranks and replicates across them.
"""

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from services.actor.engine.base import Engine
from services.actor.model import layer_classes


class FSDP2Engine(Engine):
    name = "fsdp2"

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        world, rep = dist.get_world_size(), self.cfg.hsdp_replicate
        if world % rep:
            raise ValueError(f"hsdp_replicate {rep} does not divide the world size {world}")
        if rep > 1:
            mesh = init_device_mesh(self.device.type, (rep, world // rep), mesh_dim_names=("replicate", "shard"))
        else:
            mesh = init_device_mesh(self.device.type, (world,), mesh_dim_names=("shard",))
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
            if self.cfg.mixed_precision else MixedPrecisionPolicy()
        blocks = layer_classes(model)
        for module in model.modules():
            if type(module) in blocks:
                fully_shard(module, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        return model
