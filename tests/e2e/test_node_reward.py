"""A reward server written in Node.js, scored through the same RewardClient the orchestrator uses.

Proves the contract is language-agnostic: the server loads protos/ at run time
with @grpc/grpc-js and reads meshrl's row streams. Skipped where node/npm are absent.
"""

import grpc
import pytest
from node_example import needs_node, start

from meshrl.clients import RewardClient
from meshrl.codec import Payload, split_rows
from meshrl.dataproto import DataProto
from meshrl.errors import ServiceError
from meshrl.v1 import reward_pb2
from services.reward.scorers import arithmetic

pytestmark = needs_node


@pytest.fixture(scope="module")
def node_server():
    proc, address = start("node-reward")
    client = RewardClient(address, timeout=60)
    client.wait_ready(30)
    yield client
    proc.terminate()
    proc.wait(10)


def batch(responses, truths):
    return DataProto(
        non_tensor_batch={
            "response_text": responses,
            "data_source": ["arithmetic"] * len(responses),
            "reward_model": [{"ground_truth": t} for t in truths],
        }
    )


def test_describe(node_server):
    assert node_server.describe().backend == "node"


def test_node_scores_match_the_builtin_scorer(node_server):
    responses = ["7", " 7\nbecause", "8", "seven", "-3", "", "12"]
    truths = ["7", "7", "7", "7", "-3", "0", "12"]
    out = node_server.score(batch(responses, truths))
    expected = [arithmetic.compute_score("arithmetic", r, t)["score"] for r, t in zip(responses, truths)]
    assert out.scores.tolist() == expected
    assert list(out.columns["acc"]) == [s == 1.0 for s in expected]
    assert out.metrics["reward/score/mean"] == pytest.approx(sum(expected) / len(expected))


def test_node_reads_a_streamed_batch_in_order(node_server):
    n = 30000
    data = batch([str(i) if i % 4 else "no" for i in range(n)], [str(i) for i in range(n)])
    data.non_tensor_batch["prompt_text"] = ["What is the number after this one? " * 6] * n  # ~6 MB
    assert len(list(split_rows(Payload(reward_pb2.ScoreRequest(), data)))) > 1  # it really is a stream
    assert node_server.score(data).scores.tolist() == [float(i % 4 != 0) for i in range(n)]


def test_node_rejects_a_batch_without_responses(node_server):
    with pytest.raises(ServiceError) as e:
        node_server.score(DataProto(non_tensor_batch={"data_source": ["arithmetic"]}))
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "response_text" in e.value.details
    assert node_server.score(batch(["1"], ["1"])).scores.tolist() == [1.0]
