"""One push to a fleet of rollout replicas, on the receiving side (HF backend, real gRPC servers): over shm
the sender writes each bucket once and the other replicas on the host read it (WeightBucket.shm_source);
over stream it goes down a chain of replicas on several addresses (WeightBucket.relay_to). The shared
rollout fixture (conftest.py) is the first replica of each fleet; the tests start the others."""

import grpc
import pytest
import torch
from calls import ROLLOUT as SERVICE
from calls import chats, current_weights, expect, generate

from meshrl import weights
from meshrl.config.rollout import RolloutConfig
from meshrl.delta import whole
from meshrl.rpc import Client, Server
from meshrl.shm import SEAL_BYTES
from meshrl.v1 import rollout_pb2
from services.rollout.servicer import RolloutServicer


@pytest.mark.parametrize("bucket", [1 << 20, 0], ids=["buckets", "whole"])
def test_replicas_on_one_host_read_the_bucket_the_sender_wrote_once(rollout, tiny_lm, bucket):
    """shm to a fleet on the sender's host: each bucket is written into one replica's segment and the other
    replica reads it from there (WeightBucket.shm_source); its own segment is never written. Both then
    generate what a push of their own would give. A source not sealed for this update is refused."""
    probe = chats("6+7=", "9+9=")
    named = current_weights(tiny_lm, 1.15)
    other = RolloutServicer(RolloutConfig(model=str(tiny_lm), backend="hf", max_model_len=64))
    server = Server([other]).start()
    try:
        with Client(server.address, SERVICE, timeout=120) as second:
            v = max(rollout.call("Describe").weight_version, 1) + 1
            buckets = weights.plan([(k, t.dtype, list(t.shape)) for k, t in named.items()], bucket or (1 << 30))
            tensors_of = lambda b: [named[r.name] for r in b.refs]  # noqa: E731
            _, failed = weights.push_to_all([rollout, second], buckets, tensors_of, weights.Push(v, "shm"))
            assert not failed
            own = other.receiver.segment
            assert own is not None and own.map[: own.size - SEAL_BYTES] == bytes(own.size - SEAL_BYTES)  # unwritten
            a = generate(rollout, probe, temperature=0.0)
            b = generate(second, probe, temperature=0.0)
            assert a.msg.weight_version == b.msg.weight_version == v
            assert torch.equal(a.data.batch["rollout_logprobs"], b.data.batch["rollout_logprobs"])
            weights.push_state(second, named, v + 1, "shm")  # its own push: the same weights
            alone = generate(second, probe, temperature=0.0).data.batch["rollout_logprobs"]
            assert torch.equal(alone, b.data.batch["rollout_logprobs"])

            refs, total = weights.layout(named)
            begun = rollout.call(
                "BeginWeightUpdate",
                rollout_pb2.BeginWeightUpdateRequest(version=v + 1, transport="shm", total_bytes=total),
            )
            bad = grpc.StatusCode.INVALID_ARGUMENT
            for transport, source, nonce, match in [
                ("shm", begun.shm_segment, b"x" * 32, "not sealed for this update"),
                ("shm", "meshrl-elsewhere", begun.shm_nonce, "not named like a meshrl weight segment"),
                ("stream", begun.shm_segment, begun.shm_nonce, "shm_source is for the shm transport"),
            ]:
                second.call(
                    "BeginWeightUpdate",
                    rollout_pb2.BeginWeightUpdateRequest(version=v + 2, transport=transport, total_bytes=total),
                )
                bucket_msg = rollout_pb2.WeightBucket(
                    version=v + 2, refs=refs, shm_source=source, shm_source_nonce=nonce
                )
                expect(bad, lambda m=bucket_msg: second.call_stream("SendWeights", iter([m])), match)
            assert second.call("Describe").weight_version == v + 1  # nothing taken
            weights.push_state(rollout, current_weights(tiny_lm), v + 2, "shm")  # as the other tests expect
    finally:
        server.stop(0)
        other.close()


class Counted:
    """A rollout client that counts the bytes the sender streams to it."""

    def __init__(self, client):
        self.client, self.address, self.sent = client, client.address, 0

    def call(self, *args, **kwargs):
        return self.client.call(*args, **kwargs)

    def call_stream(self, method, messages, **kwargs):
        def counted(ms):
            for m in ms:
                self.sent += len(m) if isinstance(m, bytes) else m.ByteSize()
                yield m

        return self.client.call_stream(method, counted(messages), **kwargs)


def test_a_chained_stream_push_is_sent_once_and_reaches_every_replica(rollout, tiny_lm):
    """stream with relay to replicas on "other hosts" (127.0.0.2, .3): the sender streams each bucket to the
    first replica only, which passes it down the chain (WeightBucket.relay_to); all three then generate the
    same. A hop that is not there: the reply names it and every replica after it, for the sender to send to."""
    probe = chats("6+7=", "9+9=")
    named = current_weights(tiny_lm, 1.25)
    servicers = [RolloutServicer(RolloutConfig(model=str(tiny_lm), backend="hf", max_model_len=64)) for _ in range(2)]
    servers = [Server([s], host=f"127.0.0.{i + 2}").start() for i, s in enumerate(servicers)]
    try:
        clients = [Counted(rollout)] + [Counted(Client(s.address, SERVICE, timeout=120)) for s in servers]
        v = max(c.call("Describe").weight_version for c in clients) + 1
        buckets = weights.plan([(k, t.dtype, list(t.shape)) for k, t in named.items()], 1 << 20)
        tensors_of = lambda b: [named[r.name] for r in b.refs]  # noqa: E731
        push = weights.Push(v, "stream", rollback=True, relay=True)
        _, failed = weights.push_to_all(clients, buckets, tensors_of, push)
        assert not failed
        assert clients[0].sent > sum(b.size for b in buckets) * 0.9 and clients[1].sent == clients[2].sent == 0
        got = [generate(c.client, probe, temperature=0.0) for c in clients]
        assert [g.msg.weight_version for g in got] == [v] * 3
        for g in got[1:]:
            assert torch.equal(g.data.batch["rollout_logprobs"], got[0].data.batch["rollout_logprobs"])

        first, last = clients[1].client, clients[2].client
        refs, total = weights.layout(named)
        for c in (first, last):
            c.call(
                "BeginWeightUpdate",
                rollout_pb2.BeginWeightUpdateRequest(version=v + 1, transport="stream", total_bytes=total),
            )
        bucket = weights.Bucket(refs=refs, size=total)
        gone = "127.0.0.4:9"  # nothing listens there
        messages = weights._stream(v + 1, whole(refs, total, tensors_of(bucket)), [gone, last.address])
        reply = first.call_stream("SendWeights", messages)
        assert list(reply.relay_missed) == [gone, last.address] and gone in reply.relay_error
        weights.push_state(first, named, v + 2, "stream")  # itself took it: a complete update follows
    finally:
        for c in clients[1:]:
            c.client.close()
        for server, servicer in zip(servers, servicers):
            server.stop(0)
            servicer.close()
