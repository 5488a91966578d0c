"""A minimal RolloutService that misbehaves on request, to probe the actor's weight push: it answers
BeginWeightUpdate with whatever shm segment and nonce it is told, may stall there, and records the calls
it gets. A real gRPC server on 127.0.0.1 (meshrl.rpc.serve), as an outsider's would be."""

import threading

from meshrl.v1 import rollout_pb2


class FakeRollout:
    SERVICE = rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"]

    def __init__(self, segment: str = "", nonce: bytes = b"", stall: threading.Event | None = None):
        self.segment, self.nonce = segment, nonce
        self.stall = stall  # Begin waits until it is set (or its caller leaves): a stalled rollout
        self.calls: list[str] = []
        self.left = threading.Event()  # set when a stalled Begin's caller went away

    def BeginWeightUpdate(self, request, context) -> rollout_pb2.WeightUpdateStatus:
        self.calls.append("BeginWeightUpdate")
        while self.stall is not None and not self.stall.wait(0.05):
            if not context.is_active():
                self.left.set()
                break
        return rollout_pb2.WeightUpdateStatus(
            version=request.version, in_progress=True, shm_segment=self.segment, shm_nonce=self.nonce
        )

    def SendWeights(self, buckets, context) -> rollout_pb2.WeightUpdateStatus:
        for _ in buckets:  # the bytes (stream) are taken and dropped
            pass
        self.calls.append("SendWeights")
        return rollout_pb2.WeightUpdateStatus(in_progress=True)

    def FinishWeightUpdate(self, request, context) -> rollout_pb2.WeightUpdateStatus:
        self.calls.append("FinishWeightUpdate")
        return rollout_pb2.WeightUpdateStatus(version=request.version)
