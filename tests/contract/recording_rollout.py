"""A RolloutService stub that keeps what a weight push sent: Begin's request and every tensor, by name, as
the bytes arrived (stream: the chunks; shm: a sealed segment of its own, read when each bucket's call ends).
A real gRPC server on 127.0.0.1 (meshrl.rpc.serve), as the rollout's would be."""

import torch

from meshrl.shm import WEIGHT_PREFIX, Segment, seal
from meshrl.v1 import rollout_pb2
from meshrl.weights import ref_dtype, ref_nbytes


class RecordingRollout:
    SERVICE = rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"]

    def __init__(self, shm_bytes: int = 64 << 20):
        self.shm_bytes = shm_bytes
        self.begin: rollout_pb2.BeginWeightUpdateRequest | None = None
        self.tensors: dict[str, torch.Tensor] = {}
        self.segment: Segment | None = None
        self.finished = 0

    def BeginWeightUpdate(self, request, context) -> rollout_pb2.WeightUpdateStatus:
        self.begin, self.tensors = request, {}
        if request.transport != "shm":
            return rollout_pb2.WeightUpdateStatus(version=request.version, in_progress=True)
        if self.segment is None:
            self.segment = Segment.create(self.shm_bytes, prefix=WEIGHT_PREFIX)
        nonce = seal(self.segment)
        return rollout_pb2.WeightUpdateStatus(
            version=request.version, in_progress=True, shm_segment=self.segment.name, shm_nonce=nonce
        )

    def SendWeights(self, buckets, context) -> rollout_pb2.WeightUpdateStatus:
        refs, data = [], bytearray()
        for b in buckets:
            refs = list(b.refs) or refs
            if b.data:
                end = b.data_offset + len(b.data)
                data.extend(b"\0" * max(0, end - len(data)))
                data[b.data_offset : end] = b.data
        for ref in refs:
            if self.begin is not None and self.begin.transport == "shm":
                assert self.segment is not None
                t = self.segment.tensor(ref_dtype(ref), list(ref.shape), ref.offset).clone()
            else:
                raw = bytes(data[ref.offset : ref.offset + ref_nbytes(ref)])
                t = torch.frombuffer(bytearray(raw), dtype=ref_dtype(ref)).reshape(list(ref.shape)).clone()
            self.tensors[ref.name] = t
        return rollout_pb2.WeightUpdateStatus(in_progress=True)

    def FinishWeightUpdate(self, request, context) -> rollout_pb2.WeightUpdateStatus:
        self.finished += 1
        return rollout_pb2.WeightUpdateStatus(version=request.version)

    def close(self) -> None:
        if self.segment is not None:
            self.segment.close()
            self.segment.unlink()
