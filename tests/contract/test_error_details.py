"""An error's text reaches the caller with its status however long it is and whatever script it is in:
the cap is in UTF-8 bytes (issue 27, item 15), over a real server on 127.0.0.1."""

import grpc
import pytest
import torch

from meshrl.codec import Payload
from meshrl.dataproto import DataProto
from meshrl.errors import MAX_DETAILS, InvalidArgument, ServiceError, details_for
from meshrl.rpc import Client, serve
from meshrl.v1 import reward_pb2
from testkit.echo import SERVICE, EchoScorer


class Refuser(EchoScorer):
    """Score refuses with meta `message` as the error's text."""

    def Score(self, request, context):
        raise InvalidArgument(request.data.meta_info["message"])


@pytest.fixture(scope="module")
def client():
    server = serve(Refuser())
    with Client(server.address, SERVICE, timeout=10) as c:
        yield c
    server.stop(0)


@pytest.mark.parametrize("char", ["€", "é", "\x01", "😀", "a"])
def test_long_non_ascii_details_keep_their_status(client, char):
    # 2,500 three-byte characters were cut to 1,980 characters: ~6 KB, ~18 KB percent-encoded on the
    # wire, and the caller got RESOURCE_EXHAUSTED (the metadata limit) instead of the status.
    message = "bad field: " + char * 2500
    for _ in range(5):  # between gRPC's soft and hard metadata limits a refusal is random
        with pytest.raises(ServiceError) as e:
            client.call(
                "Score",
                Payload(reward_pb2.ScoreRequest(), DataProto({"x": torch.ones(1, 1)}, meta_info={"message": message})),
            )
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT, e.value.details
        assert e.value.details.startswith("bad field: " + char * 10)
        assert len(e.value.details.encode()) <= MAX_DETAILS


def test_the_cut_never_splits_a_character():
    for char in ["é", "€", "😀"]:
        for extra in range(4):  # every offset of the cut inside a multi-byte character
            text = "x" * extra + char * 3000
            cut = details_for(ValueError(text))
            assert len(cut.encode()) <= MAX_DETAILS and cut.endswith(f"... [{len(text)} chars]")
            assert cut.removesuffix(f"... [{len(text)} chars]").strip("x").strip(char) == ""
    assert details_for(ValueError("short é")) == "short é"
    assert details_for(ValueError("lone \ud800 surrogate")).encode()  # still encodable for the trailers
