"""Training engines, chosen by name: fsdp2, fsdp1, plain (auto: plain on one rank, fsdp2 on several).

- base: Engine, what every engine does (forward, forward-backward with a given loss, optimizer step, state
  dicts, checkpoints, offload); fsdp2, fsdp1 and plain decide only how the model is wrapped.

Another engine (Megatron, torchtitan) is one more entry here; the roles do not change.
"""

import torch.distributed as dist

from meshrl.config.actor import engine_for
from services.actor.engine.base import Engine
from services.actor.engine.fsdp1 import FSDP1Engine
from services.actor.engine.fsdp2 import FSDP2Engine
from services.actor.engine.plain import PlainEngine

ENGINES: dict[str, type[Engine]] = {"fsdp2": FSDP2Engine, "fsdp1": FSDP1Engine, "plain": PlainEngine}


def build_engine(cfg, model_path: str, kind: str = "causal", optim=None) -> Engine:
    world = dist.get_world_size() if dist.is_initialized() else 1
    return ENGINES[engine_for(cfg.engine, world)](cfg, model_path, kind, optim)
