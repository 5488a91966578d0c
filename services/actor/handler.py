"""What every rank does for each command from rank 0: build the engine, compute, update, save.

Arguments arrive as plain values (checked on rank 0 already); results go back
as DataProtos, metrics in meta_info.
"""

import pathlib
import time

import torch

from meshrl import weights
from meshrl.dataproto import DataProto
from meshrl.errors import ServiceError
from meshrl.rpc import Client
from meshrl.typed import build
from meshrl.v1 import rollout_pb2
from services.actor.config import EngineConfig, OptimConfig
from services.actor.engine import build_engine
from services.actor.losses import parse_loss
from services.actor.roles import KIND, ROLES

ROLLOUT_SERVICE = rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"]


class RankHandler:
    def __init__(self, role: str):
        self.role_name = role
        self.role = None
        self.push_failure = None  # rank 0: the rollout's refusal of the last push

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

    def push_weights(self, args: dict, part=None) -> DataProto:
        """Gather the weights bucket by bucket (collective) and, on rank 0, send each to the rollout as it is
        gathered (meshrl.weights.push): no rank holds more than one bucket of full tensors. A refusal from
        the rollout is kept in push_failure (rank 0 is the servicer's process) to reach the caller as the
        rollout said it."""
        engine = self.role.engine
        held = engine.weight_tensors()
        cast = getattr(torch, args["dtype"]) if args["dtype"] else None  # the rollout's dtype: half the bytes

        def sent(t: torch.Tensor) -> torch.dtype:
            return cast if cast is not None and t.dtype.is_floating_point else t.dtype

        buckets = weights.plan([(k, sent(t), list(t.shape)) for k, t in held.items()], args["bucket_bytes"])
        gathered = 0

        def tensors_of(bucket) -> list:
            nonlocal gathered
            gathered += 1
            return [t.to(sent(t)) for t in engine.gather(held, [r.name for r in bucket.refs])]

        self.push_failure = None
        if engine.rank != 0:
            for b in buckets:
                tensors_of(b)
            return DataProto()
        try:
            with Client(args["rollout_address"], ROLLOUT_SERVICE, timeout=600) as rollout:
                return DataProto(meta_info=weights.push(rollout, buckets, tensors_of, args["version"],
                                                        args["transport"]))
        except ServiceError as e:
            self.push_failure = e
            for b in buckets[gathered:]:  # the other ranks gather every bucket: stay in step with them
                tensors_of(b)
            return DataProto()

    def offload(self, args: dict, part=None) -> DataProto:
        return DataProto(meta_info={"device": self.role.engine.offload()})

    def reload(self, args: dict, part=None) -> DataProto:
        return DataProto(meta_info={"device": self.role.engine.reload()})
