"""What every rank does for each command from rank 0: build the engine, compute, update, save.

Arguments arrive as plain values (checked on rank 0 already); results go back
as DataProtos, metrics in meta_info.
"""

import pathlib
import time

from meshrl.dataproto import DataProto
from meshrl.typed import build
from services.actor.config import EngineConfig, OptimConfig
from services.actor.engine import build_engine
from services.actor.losses import parse_loss
from services.actor.roles import KIND, ROLES


class RankHandler:
    def __init__(self, role: str):
        self.role_name = role
        self.role = None
        self.full_state: dict = {}

    def init(self, args: dict, part=None) -> None:
        engine_cfg = build(EngineConfig, args["engine"], "engine")
        optim = build(OptimConfig, args["optim"], "optim") if self.role_name != "ref" else None
        engine = build_engine(engine_cfg, args["model"], KIND[self.role_name], optim)
        self.role = ROLES[self.role_name](engine)

    def logprobs(self, args: dict, part: DataProto) -> DataProto:
        return self.role.logprobs(part, args["temperature"], args["with_entropy"])

    def values(self, args: dict, part: DataProto) -> DataProto:
        return self.role.values(part)

    def update(self, args: dict, part: DataProto) -> DataProto:
        params = parse_loss(self.role_name, args["loss"], args["params"])
        start = time.perf_counter()
        metrics = self.role.update(part, args["loss"], params, args["total_rows"], args["step"])
        metrics[f"{self.role_name}/update_seconds"] = time.perf_counter() - start  # this rank's; rank 0 reports
        return DataProto(meta_info=metrics)

    def save(self, args: dict, part=None) -> None:
        self.role.engine.save(args["path"])
        if args.get("export_hf"):
            self.role.engine.export_hf(pathlib.Path(args["path"]) / "hf")

    def load(self, args: dict, part=None) -> None:
        self.role.engine.load(args["path"])

    def gather_weights(self, args: dict, part=None) -> None:
        """Collect the full state dict on rank 0 (kept here for the push; too big to send back as a result)."""
        self.full_state = self.role.engine.full_state_dict()

    def offload(self, args: dict, part=None) -> DataProto:
        return DataProto(meta_info={"device": self.role.engine.offload()})

    def reload(self, args: dict, part=None) -> DataProto:
        return DataProto(meta_info={"device": self.role.engine.reload()})
