"""The actor's weight push against rollouts that misbehave (fake RolloutServices, tests/contract/fake_rollout.py):
it writes only into a /dev/shm segment of ours sealed for this push (issue 27, item 7), and a push stops
with its caller (item 14)."""

import hashlib
import os
import pathlib
import secrets
import threading
import time

import grpc
import pytest
from actor_process import Service
from fake_rollout import FakeRollout

from meshrl.errors import ServiceError
from meshrl.rpc import serve
from meshrl.shm import SHM_DIR, WEIGHT_PREFIX, Segment, seal
from meshrl.v1 import actor_pb2

VICTIM_BYTES = 16 << 20  # more than the tiny model's 11.8 MB: a push fits into it whole


def push(actor, rollout_address: str, timeout: float = 60, **request):
    msg = actor_pb2.PushWeightsRequest(rollout_address=rollout_address, version=1, **request)
    return actor.client.call("PushWeights", msg, timeout=timeout)


def digest(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def sealed_victim(name: str | None = None) -> tuple[pathlib.Path, bytes]:
    """A file in /dev/shm full of random bytes and sealed (so only the check under test can refuse it);
    our naming unless `name` is given."""
    seg = Segment.create(VICTIM_BYTES, prefix=WEIGHT_PREFIX) if name is None else Segment(name, VICTIM_BYTES)
    seg.map[:] = os.urandom(VICTIM_BYTES)
    nonce = seal(seg)
    seg.close()
    return seg.path, nonce


def our_name() -> str:
    return f"{WEIGHT_PREFIX}-{os.getpid()}-{secrets.token_hex(6)}"


def test_a_push_writes_only_into_a_segment_of_ours_sealed_for_it(actor):
    """A rollout names the segment to write into; an outsider's names a victim. Refused, each alone: a file
    not of our naming, a symlink or a second link of our naming to a sealed file, and a segment of ours
    sealed for another update (a nonce the outsider cannot read). The victims' bytes stay as they were; a
    segment sealed for this push is written."""
    made: list[pathlib.Path] = []
    try:
        other, other_nonce = sealed_victim(f"victim-{secrets.token_hex(6)}")  # not our naming
        live, _ = sealed_victim()  # ours, sealed for an update the outsider knows nothing of
        target, target_nonce = sealed_victim()
        link, hard = SHM_DIR / our_name(), SHM_DIR / our_name()
        made += [other, live, target, link, hard]
        link.symlink_to(other)
        os.link(target, hard)
        cases = {
            "not our naming": (other.name, other_nonce),
            "a symlink": (link.name, other_nonce),
            "a second link": (hard.name, target_nonce),
            "sealed for another update": (live.name, os.urandom(32)),
        }
        before = {p: digest(p) for p in (other, live, target)}
        for case, (name, nonce) in cases.items():
            server = serve(FakeRollout(name, nonce), port=0)
            try:
                with pytest.raises(ServiceError) as e:
                    push(actor, server.address)
                assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT, (case, e.value)
                assert "refused" in e.value.details and name in e.value.details, (case, e.value.details)
            finally:
                server.stop(0)
            assert {p: digest(p) for p in before} == before, case  # nothing was written anywhere
        good, nonce = sealed_victim()  # a positive control: sealed for this push, so written
        made.append(good)
        unwritten = digest(good)
        server = serve(FakeRollout(good.name, nonce), port=0)
        try:
            assert push(actor, server.address).num_bytes > 0
        finally:
            server.stop(0)
        assert digest(good) != unwritten
    finally:
        for p in made:
            p.unlink(missing_ok=True)


def test_a_push_stops_with_its_caller_and_holds_up_nothing(actor):
    """A push to a stalled rollout whose caller leaves (a 3 s deadline) stops: its call to the rollout is cut,
    a push queued behind it whose caller left too is dropped, not run, and the next push runs at once."""
    stall = threading.Event()
    stalled, quiet = FakeRollout(stall=stall), FakeRollout()
    servers = [serve(stalled, port=0), serve(quiet, port=0)]
    try:
        first = threading.Thread(
            target=lambda: pytest.raises(ServiceError, push, actor, servers[0].address, timeout=3, transport="stream"),
            daemon=True,
        )
        first.start()
        for _ in range(100):  # until the first push is at the stalled rollout (it holds the actor's ranks)
            if stalled.calls:
                break
            time.sleep(0.05)
        with pytest.raises(ServiceError) as e:  # queued behind it; its caller leaves first
            push(actor, servers[1].address, timeout=1, transport="stream")
        assert e.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        first.join(10)
        assert stalled.left.wait(10), "the actor's call to the stalled rollout was not cut"
        start = time.monotonic()
        assert push(actor, servers[1].address, timeout=30, transport="stream").num_bytes > 0
        assert time.monotonic() - start < 10
        assert quiet.calls == ["BeginWeightUpdate", "SendWeights", "FinishWeightUpdate"]  # the dropped one: none
        assert actor.call("Describe").details["partial"] == ""  # a stopped push leaves the weights whole
    finally:
        stall.set()
        for s in servers:
            s.stop(0)


def test_sigterm_stops_an_actor_stuck_in_a_push(tiny_lm, tmp_path):
    """The caller of a push to a stalled rollout still waits (no deadline of its own for minutes): SIGTERM
    stops the service within its grace, not after the push's deadline."""
    s = Service("--role", "actor", "--model", str(tiny_lm), "--world-size", "1", root=str(tmp_path))
    stall = threading.Event()
    stalled = FakeRollout(stall=stall)
    server = serve(stalled, port=0)
    try:
        waiting = threading.Thread(
            target=lambda: pytest.raises(ServiceError, push, s, server.address, timeout=300, transport="stream"),
            daemon=True,
        )
        waiting.start()
        for _ in range(100):
            if stalled.calls:
                break
            time.sleep(0.05)
        start = time.monotonic()
        s.proc.terminate()
        assert s.proc.wait(60) == 0
        assert time.monotonic() - start < 20  # the server's 5 s grace, then the push stops
    finally:
        stall.set()
        server.stop(0)
        if s.proc.poll() is None:
            s.proc.kill()
