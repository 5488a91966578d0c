"""The plain engine: the whole model in one process, no sharding. For debugging and reference."""

import torch
import torch.distributed as dist

from services.actor.engine.base import Engine


class PlainEngine(Engine):
    name = "plain"

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        if dist.get_world_size() != 1:
            raise ValueError(
                f"the plain engine runs on one rank; this group has {dist.get_world_size()} (use fsdp2 for several)"
            )
        return model

    def autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.cfg.mixed_precision)
