"""Overload (issue 27, item 16): calls past a service's work limit wait in a short bounded queue, a
refusal carries a retry-after hint, and meshrl.rpc.Client retries such refusals with jittered backoff.
Behaviour only; the goodput figures are in bench/RESULTS.md (bench/overload_bench.py)."""

import threading
import time

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from meshrl.codec import Payload, split_rows
from meshrl.dataproto import DataProto
from meshrl.errors import ResourceExhausted, ServiceError
from meshrl.rpc import Client, serve
from meshrl.v1 import reward_pb2
from testkit.echo import SERVICE, EchoScorer

SCORE = "/meshrl.v1.RewardService/Score"


def request(sleep: float = 0.0, **meta) -> Payload:
    return Payload(reward_pb2.ScoreRequest(), DataProto({"x": torch.ones(1, 2)}, meta_info={"sleep": sleep, **meta}))


def in_background(fn, n: int) -> tuple[list[threading.Thread], list, list]:
    results, errors = [], []

    def work():
        try:
            results.append(fn())
        except Exception as e:  # noqa: BLE001 - collected and checked by the test
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(n)]
    for t in threads:
        t.start()
    return threads, results, errors


def raw_score(address: str, timeout: float = 30):
    """One Score call through a plain gRPC stub: no retries of ours."""
    with grpc.insecure_channel(address) as ch:
        return list(ch.stream_stream(SCORE)(split_rows(request(0.0)), timeout=timeout))


def test_a_hundred_plain_callers_of_a_default_service_wait_rather_than_being_refused():
    """The default queue is 8 calls per work slot: 100 callers at once of a 16-slot service all wait for a
    slot, even callers that never retry (a plain gRPC stub). With a queue of 16, 68 were refused."""
    server = serve(EchoScorer())  # 16 slots, the default queue and wait

    def call():
        with grpc.insecure_channel(server.address) as ch:
            return list(ch.stream_stream(SCORE)(split_rows(request(0.05)), timeout=60))

    try:
        threads, results, errors = in_background(call, 100)
        for t in threads:
            t.join(120)
        assert not errors, errors[:3]
        assert len(results) == 100
    finally:
        server.stop(0)


def test_clients_past_capacity_all_get_served():
    # Capacity 2 and a queue of 2, calls of 1 s, 8 callers at once: 2 run, 2 wait, 4 are refused with a hint
    # and retry. Before the queue and the retries, 6 of the 8 failed with RESOURCE_EXHAUSTED.
    server = serve(EchoScorer(), max_workers=2, queue=2)
    try:

        def call():
            with Client(server.address, SERVICE, timeout=60) as c:
                return c.call("Score", request(1.0)).data.batch["scores"].tolist()

        threads, results, errors = in_background(call, 8)
        for t in threads:
            t.join()
        assert not errors, errors
        assert results == [[2.0]] * 8
    finally:
        server.stop(0)


def test_a_call_waits_for_a_slot_rather_than_failing():
    server = serve(EchoScorer(), max_workers=1)
    try:
        threads, _, errors = in_background(
            lambda: Client(server.address, SERVICE, timeout=30).call("Score", request(0.5)), 1
        )
        time.sleep(0.2)  # the slow call holds the only slot
        assert raw_score(server.address)  # no retry of ours: it waited in the queue
        threads[0].join()
        assert not errors
    finally:
        server.stop(0)


def test_past_the_queue_a_refusal_carries_a_retry_after_hint():
    server = serve(EchoScorer(), max_workers=1, queue=1)
    try:
        threads, _, errors = in_background(
            lambda: Client(server.address, SERVICE, timeout=30).call("Score", request(2.0)), 2
        )
        time.sleep(0.5)  # one call runs, one waits: the queue is full
        with pytest.raises(grpc.RpcError) as e:
            raw_score(server.address)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        hint = dict(e.value.trailing_metadata())["retry-after-ms"]
        assert int(hint) > 0
        assert "the service is busy: 1 calls in progress" in e.value.details()
        assert f"retry after {hint} ms" in e.value.details()
        with Client(server.address, SERVICE, timeout=5) as c:  # light calls keep threads of their own
            assert c.call("Describe").backend == "echo"
            health = health_pb2_grpc.HealthStub(c.channel).Check(health_pb2.HealthCheckRequest(), timeout=2)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
        for t in threads:
            t.join()
        assert not errors
    finally:
        server.stop(0)


class Counting(EchoScorer):
    """Score always raises the service's own ResourceExhausted (a limit of its own, no hint)."""

    def __init__(self):
        self.calls = 0

    def Score(self, request, context):
        self.calls += 1
        raise ResourceExhausted("2 episodes are open (the limit)")


def test_a_refusal_without_a_hint_is_not_retried():
    # RESOURCE_EXHAUSTED from the method itself (or gRPC's message size limit) may have done work
    # or can never succeed: only the capacity refusal, sent before the method runs, is retried.
    servicer = Counting()
    server = serve(servicer)
    try:
        with Client(server.address, SERVICE, timeout=10) as c:
            with pytest.raises(ServiceError) as e:
                c.call("Score", request())
        assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED and servicer.calls == 1
    finally:
        server.stop(0)


def test_retries_stop_at_the_deadline_and_the_attempt_bound():
    server = serve(EchoScorer(), max_workers=1, queue=0)
    try:
        busy = Client(server.address, SERVICE, timeout=30)
        threads, _, _ = in_background(lambda: busy.call("Score", request(3.0)), 1)
        time.sleep(0.3)
        start = time.monotonic()
        with Client(server.address, SERVICE, timeout=1.0) as c:
            with pytest.raises(ServiceError) as e:
                c.call("Score", request())
        assert e.value.code in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.DEADLINE_EXCEEDED)
        assert time.monotonic() - start < 2.0  # within its deadline, not the busy call's 3 s
        with Client(server.address, SERVICE, timeout=30, busy_retries=0) as c:
            with pytest.raises(ServiceError) as e:
                c.call("Score", request())
        assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        for t in threads:
            t.join()
    finally:
        server.stop(0)
