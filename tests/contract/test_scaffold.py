"""The service scaffolding over a real gRPC server on 127.0.0.1."""

import signal
import socket
import subprocess
import sys
import threading
import time

import grpc
import pytest
import torch
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from meshrl.codec import Payload, decode_message, split_rows
from meshrl.dataproto import DataProto
from meshrl.errors import ServiceError
from meshrl.rpc import Client, serve
from meshrl.v1 import common_pb2, reward_pb2
from testkit.echo import SERVICE, EchoScorer

TOKEN = "s3cret"


@pytest.fixture(scope="module")
def server():
    s = serve(EchoScorer(), token=TOKEN)
    yield s
    s.stop(1)


@pytest.fixture
def client(server):
    with Client(server.address, SERVICE, token=TOKEN, timeout=30) as c:
        yield c


def score(client, data, **kw):
    return client.call("Score", Payload(reward_pb2.ScoreRequest(), data), **kw)


def test_binds_loopback_and_reports_health(server, client):
    assert server.address.startswith("127.0.0.1:")
    assert client.health() == "SERVING"
    assert client.health(SERVICE.full_name) == "SERVING"
    with pytest.raises(ServiceError) as e:
        client.health("meshrl.v1.NoSuchService")
    assert e.value.code == grpc.StatusCode.NOT_FOUND


def test_health_command(server):
    ok = subprocess.run([sys.executable, "-m", "cli", "health", server.address], capture_output=True, text=True)
    assert ok.returncode == 0 and "SERVING" in ok.stdout
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    down = subprocess.run(
        [sys.executable, "-m", "cli", "health", f"127.0.0.1:{free}", "--timeout", "1"],
        capture_output=True,
        text=True,
    )
    assert down.returncode == 1 and "UNAVAILABLE" in down.stderr


def test_reflection_lists_and_describes_services(server):
    with grpc.insecure_channel(server.address) as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        md = (("authorization", f"Bearer {TOKEN}"),)
        [reply] = stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), metadata=md
        )
        names = {s.name for s in reply.list_services_response.service}
        assert {"meshrl.v1.RewardService", "grpc.health.v1.Health"} <= names
        [reply] = stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(file_containing_symbol="meshrl.v1.RewardService")]),
            metadata=md,
        )
        assert reply.file_descriptor_response.file_descriptor_proto


def test_small_call_round_trip(client):
    assert client.call("Describe").backend == "echo"
    data = DataProto({"x": torch.ones(3, 2)}, {"src": ["a", "b", "c"]})
    reply = score(client, data)
    assert reply.msg.metrics["num_rows"] == 3
    assert torch.equal(reply.data.batch["scores"], torch.full((3,), 2.0))
    assert list(reply.data.non_tensor_batch["src"]) == ["a", "b", "c"]


def test_typed_calls_name_the_reply_class(client):
    """call_message / call_batch / describe: the same call, typed; a wrong reply class is refused unsent."""
    assert client.describe().backend == "echo"
    data = DataProto({"x": torch.ones(2, 2)})
    msg, scored = client.call_batch("Score", Payload(reward_pb2.ScoreRequest(), data), reward_pb2.ScoreResponse)
    assert msg.metrics["num_rows"] == 2 and torch.equal(scored.batch["scores"], torch.full((2,), 2.0))
    with pytest.raises(TypeError, match="replies with ServiceInfo, not ScoreResponse"):
        client.call_message("Describe", None, reward_pb2.ScoreResponse)
    with pytest.raises(TypeError, match="carries a batch: call RewardService.Score with call_batch"):
        client.call_message("Score", Payload(reward_pb2.ScoreRequest(), data), reward_pb2.ScoreResponse)
    with pytest.raises(TypeError, match="carries no batch: call RewardService.Describe with call_message"):
        client.call_batch("Describe", None, common_pb2.ServiceInfo)


def test_big_batch_streams_both_ways(server, client):
    rows = 16384
    data = DataProto(
        {"x": torch.randn(rows, 512), "ids": torch.arange(rows * 64).view(rows, 64)},
        {"uid": [f"u{i}" for i in range(rows)]},
    )  # ~40 MB
    reply = score(client, data)
    assert torch.equal(reply.data.batch["x"], data.batch["x"]) and torch.equal(
        reply.data.batch["ids"], data.batch["ids"]
    )
    assert torch.allclose(reply.data.batch["scores"], data.batch["x"].sum(1))
    assert list(reply.data.non_tensor_batch["uid"]) == list(data.non_tensor_batch["uid"])
    # It really travelled as a stream of ~4 MB messages, both ways.
    parts = list(split_rows(Payload(reward_pb2.ScoreRequest(), data)))
    assert len(parts) >= 8 and max(map(len, parts)) <= 5 << 20
    with grpc.insecure_channel(server.address, options=[("grpc.max_receive_message_length", 8 << 20)]) as ch:
        replies = list(
            ch.stream_stream("/meshrl.v1.RewardService/Score")(
                iter(parts), metadata=(("authorization", f"Bearer {TOKEN}"),), timeout=60
            )
        )
    assert len(replies) >= 8
    assert decode_message(reward_pb2.ScoreResponse, replies[0])[2] == rows


@pytest.mark.parametrize(
    "parts,match",
    [
        ([b"\x0a\x05garbage"], "malformed protobuf"),
        ([reward_pb2.ScoreRequest().SerializeToString()], "ScoreRequest.data is missing"),
    ],
)
def test_bad_bytes_are_invalid_argument_then_service_carries_on(server, client, parts, match):
    with grpc.insecure_channel(server.address) as ch:
        call = ch.stream_stream("/meshrl.v1.RewardService/Score")
        with pytest.raises(grpc.RpcError) as e:
            list(call(iter(parts), metadata=(("authorization", f"Bearer {TOKEN}"),), timeout=10))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and match in e.value.details()
    assert score(client, DataProto({"x": torch.ones(1, 1)})).data.batch["scores"].item() == 1.0


def test_truncated_stream_is_invalid_argument(server):
    parts = list(split_rows(Payload(reward_pb2.ScoreRequest(), DataProto({"x": torch.randn(4096, 1024)}))))
    with grpc.insecure_channel(server.address) as ch:
        with pytest.raises(grpc.RpcError) as e:
            list(
                ch.stream_stream("/meshrl.v1.RewardService/Score")(
                    iter(parts[:-1]), metadata=(("authorization", f"Bearer {TOKEN}"),), timeout=30
                )
            )
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "truncated" in e.value.details()


def test_errors_map_to_status_codes(client):
    with pytest.raises(ServiceError) as e:
        score(client, DataProto({"y": torch.ones(2, 2)}))
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "tensor 'x' is missing" in e.value.details
    with pytest.raises(ServiceError) as e:
        score(client, DataProto({"x": torch.ones(1)}, meta_info={"fail": "crash"}))
    assert e.value.code == grpc.StatusCode.INTERNAL and "RuntimeError: boom" in e.value.details
    assert client.health() == "SERVING"
    assert score(client, DataProto({"x": torch.ones(2, 2)})).data.batch["scores"].tolist() == [2.0, 2.0]


def test_token_is_required_except_for_health(server):
    data = DataProto({"x": torch.ones(1, 1)})
    for token in (None, "wrong"):
        with Client(server.address, SERVICE, token=token) as c:
            assert c.health() == "SERVING"
            with pytest.raises(ServiceError) as e:
                score(c, data)
            assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(ServiceError) as e:
                c.call("Describe")
            assert e.value.code == grpc.StatusCode.UNAUTHENTICATED


def test_deadline_is_enforced(client):
    with pytest.raises(ServiceError) as e:
        score(client, DataProto({"x": torch.ones(1)}, meta_info={"sleep": 2}), timeout=0.3)
    assert e.value.code == grpc.StatusCode.DEADLINE_EXCEEDED


def test_unknown_method_names_are_refused(client):
    with pytest.raises(ValueError, match="has no method 'Scorre'"):
        client.call("Scorre")


def test_a_taken_port_is_refused_not_shared(server):
    """gRPC's default SO_REUSEPORT let a second server split the connections with the first."""
    with pytest.raises(OSError, match=f"could not bind 127.0.0.1:{server.port}"):
        serve(EchoScorer(), port=server.port)
    out = subprocess.run(
        [sys.executable, "-m", "cli", "serve", "reward", "--workers", "0", "--port", str(server.port)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1] == (
        f"meshrl serve reward: could not bind 127.0.0.1:{server.port} (is another server on that port?)"
    )
    for _ in range(30):  # every new connection still reaches the one server
        with Client(server.address, SERVICE, token=TOKEN) as c:
            assert c.call("Describe").backend == "echo"


def test_health_needs_a_port_and_no_heavy_imports(server):
    out = subprocess.run([sys.executable, "-m", "cli", "health", "localhost"], capture_output=True, text=True)
    assert out.returncode == 2 and "give HOST:PORT, got 'localhost'" in out.stderr
    probe = (
        "import sys; from cli.main import main; rc = main(['health', sys.argv[1]]); "
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules; sys.exit(rc)"
    )
    ok = subprocess.run([sys.executable, "-c", probe, server.address], capture_output=True, text=True)
    assert ok.returncode == 0 and "SERVING" in ok.stdout, ok.stderr


def test_wait_ready_names_the_service_that_is_there_instead(server):
    from meshrl.v1 import actor_pb2

    actor = actor_pb2.DESCRIPTOR.services_by_name["ActorService"]
    with Client(server.address, actor, token=TOKEN) as c:
        with pytest.raises(
            ValueError,
            match=rf"{server.address} serves \['meshrl.v1.RewardService'\], not "
            r"meshrl.v1.ActorService: is the address right\?",
        ):
            c.wait_ready(30)  # a ValueError at once, not a TimeoutError after 30 s


def test_client_retries_until_the_server_is_up():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = []
    threading.Timer(0.5, lambda: started.append(serve(EchoScorer(), port=port))).start()
    try:
        with Client(f"127.0.0.1:{port}", SERVICE, retries=8, backoff=0.1, timeout=20) as c:
            assert c.call("Describe").backend == "echo"
    finally:
        for s in started:
            s.stop(0)


def test_wait_ready_times_out_with_the_address():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with Client(f"127.0.0.1:{port}", SERVICE) as c:
        with pytest.raises(TimeoutError, match=f"RewardService at 127.0.0.1:{port} not ready"):
            c.wait_ready(timeout=0.5)


def test_concurrent_clients(server):
    errors = []

    def work(i):
        try:
            with Client(server.address, SERVICE, token=TOKEN) as c:
                for _ in range(5):
                    x = torch.full((64, 8), float(i))
                    assert score(c, DataProto({"x": x})).data.batch["scores"].tolist() == [8.0 * i] * 64
        except Exception as e:  # noqa: BLE001 - collected and reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_busy_work_never_starves_health_or_describe():
    """With no queue (queue=0), calls beyond the work limit are refused at once (RESOURCE_EXHAUSTED); health
    checks and Describe answer from their own threads while every work thread is stuck (with a queue:
    tests/contract/test_overload.py)."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    s = serve(EchoScorer(), max_workers=3, queue=0)
    slow = Payload(reward_pb2.ScoreRequest(), DataProto({"x": torch.ones(1, 1)}, meta_info={"sleep": 4}))
    stuck = [
        threading.Thread(target=lambda: Client(s.address, SERVICE, timeout=30).call("Score", slow)) for _ in range(3)
    ]
    for t in stuck:
        t.start()
    time.sleep(0.5)
    with Client(s.address, SERVICE, timeout=3, busy_retries=0) as c:
        with pytest.raises(ServiceError) as e:
            score(c, DataProto({"x": torch.ones(1, 1)}))
        assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED and "busy: 3 calls" in e.value.details
        assert c.call("Describe").backend == "echo"
        health = health_pb2_grpc.HealthStub(c.channel).Check(health_pb2.HealthCheckRequest(), timeout=2)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
    for t in stuck:
        t.join()
    with Client(s.address, SERVICE, timeout=5) as c:  # and the limit is given back
        assert score(c, DataProto({"x": torch.ones(1, 2)})).data.batch["scores"].tolist() == [2.0]
    s.stop(0)


def test_sigterm_drains_in_flight_calls_then_exits(tmp_path):
    port_file = tmp_path / "port"
    proc = subprocess.Popen([sys.executable, "-m", "testkit.echo", str(port_file)])
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text():
            assert time.monotonic() < deadline and proc.poll() is None, "service did not start"
            time.sleep(0.05)
        address = f"127.0.0.1:{port_file.read_text()}"
        c = Client(address, SERVICE, timeout=30)
        c.wait_ready(10)
        result = {}
        slow = threading.Thread(
            target=lambda: result.update(r=score(c, DataProto({"x": torch.ones(1, 3)}, meta_info={"sleep": 1.5})))
        )
        slow.start()
        time.sleep(0.5)  # the slow call is in flight
        proc.send_signal(signal.SIGTERM)
        slow.join(10)
        assert result["r"].data.batch["scores"].item() == 3.0  # finished despite the signal
        assert proc.wait(15) == 0
        with pytest.raises(ServiceError) as e:
            Client(address, SERVICE, retries=0, timeout=2).call("Describe")
        assert e.value.code == grpc.StatusCode.UNAVAILABLE
    finally:
        proc.kill()
