"""A RewardService stand-in for testing the scaffolding (server, codec, interceptors), not scoring.

Score returns `scores` = row sums of tensor `x` and echoes every tensor and column.
meta `sleep` (seconds) delays the reply; meta `fail` = "invalid" / "crash" raises.
Run as a module it serves until SIGTERM: python -m testkit.echo PORT_FILE [TOKEN]
"""

import pathlib
import sys
import time

from meshrl.codec import Payload
from meshrl.dataproto import DataProto
from meshrl.errors import InvalidArgument
from meshrl.rpc import serve
from meshrl.v1 import common_pb2, reward_pb2

SERVICE = reward_pb2.DESCRIPTOR.services_by_name["RewardService"]


class EchoScorer:
    SERVICE = SERVICE

    def Describe(self, request, context):
        return common_pb2.ServiceInfo(service="reward", backend="echo")

    def Score(self, request: Payload, context) -> Payload:
        data = request.data
        if data is None:
            raise InvalidArgument("ScoreRequest.data is missing")
        time.sleep(float(data.meta_info.get("sleep", 0)))
        fail = data.meta_info.get("fail")
        if fail == "invalid":
            raise InvalidArgument("meta 'fail' asked for a bad request")
        if fail == "crash":
            raise RuntimeError("boom")
        if "x" not in data.batch:
            raise InvalidArgument(f"tensor 'x' is missing; got {sorted(data.batch)}")
        out = DataProto({**data.batch, "scores": data.batch["x"].float().flatten(1).sum(1)}, data.non_tensor_batch)
        return Payload(reward_pb2.ScoreResponse(metrics={"num_rows": len(data)}), out)


if __name__ == "__main__":
    server = serve(EchoScorer(), token=sys.argv[2] if len(sys.argv) > 2 else None)
    pathlib.Path(sys.argv[1]).write_text(str(server.port))
    server.run_until_signal(grace=10)
