"""A reward server as an outside team would write it from protos/meshrl/v1 alone: no meshrl import.

    python minimal_reward_server.py GENERATED_DIR PORT_FILE

GENERATED_DIR holds the code grpc_tools.protoc made from the .proto files. The
server does the least docs/wire.md asks: Score answers every request with the
`scores` tensor only (no token_level_scores, no columns, no metrics), health
answers for the whole server only (not per service), and there is no Describe
and no reflection. Score: 1.0 when response_text equals the row's ground
truth, else 0.0.
"""

import struct
import sys
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc


def main(generated: str, port_file: str) -> None:
    sys.path.insert(0, generated)
    from meshrl.v1 import data_pb2, reward_pb2, reward_pb2_grpc

    assert reward_pb2.__file__.startswith(generated), "must run on the generated code alone"

    def column(data, name):
        col = data.non_tensors[name]
        return list(col.strings) if col.strings else list(col.values)

    class Scorer(reward_pb2_grpc.RewardServiceServicer):
        def Score(self, request_iterator, context):
            responses, truths = [], []
            for part in request_iterator:  # a large batch arrives as several messages of rows
                responses += column(part.data, "response_text")
                for rm in column(part.data, "reward_model"):
                    truth = rm.map_value.fields["ground_truth"]
                    truths.append(truth.string_value if truth.HasField("string_value") else str(truth.int_value))
            scores = [float(r.strip() == t) for r, t in zip(responses, truths)]
            tensor = data_pb2.Tensor(
                name="scores",
                dtype=data_pb2.FLOAT32,
                shape=[len(scores)],
                data=struct.pack(f"<{len(scores)}f", *scores),
            )
            yield reward_pb2.ScoreResponse(data=data_pb2.DataProto(tensors=[tensor], num_rows=len(scores)))

    server = grpc.server(futures.ThreadPoolExecutor(4))
    reward_pb2_grpc.add_RewardServiceServicer_to_server(Scorer(), server)
    checker = health.HealthServicer()
    checker.set("", health_pb2.HealthCheckResponse.SERVING)  # the whole server only
    health_pb2_grpc.add_HealthServicer_to_server(checker, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    with open(port_file, "w") as f:
        f.write(str(port))
    server.wait_for_termination()


if __name__ == "__main__":
    main(*sys.argv[1:])
