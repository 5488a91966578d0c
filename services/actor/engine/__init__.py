"""Training engines, chosen by name: fsdp2 (default), fsdp1, plain.

Another engine (Megatron, torchtitan) is one more entry here; the roles do not change.
"""

from services.actor.engine.base import Engine
from services.actor.engine.fsdp1 import FSDP1Engine
from services.actor.engine.fsdp2 import FSDP2Engine
from services.actor.engine.plain import PlainEngine

ENGINES: dict[str, type[Engine]] = {"fsdp2": FSDP2Engine, "fsdp1": FSDP1Engine, "plain": PlainEngine}


def build_engine(cfg, model_path: str, kind: str = "causal", optim=None) -> Engine:
    return ENGINES[cfg.engine](cfg, model_path, kind, optim)
