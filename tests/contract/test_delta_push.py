"""Delta weight pushes on the receiving side (HF backend, bf16, real gRPC servers in this process): over shm
and stream, in buckets or whole, and down a chain of replicas, a rollout that took only the changes holds bit
for bit what a rollout that took every push whole holds; a corrupted base is caught by the checksum and
repaired by a full push; a replica without the delta's base refuses it (ABORTED) and takes a full one."""

import grpc
import pytest
import torch
from calls import chats, current_weights, expect, generate, serve

from meshrl import weights
from meshrl.delta import Base
from meshrl.errors import ServiceError
from meshrl.v1 import rollout_pb2

STEPS = 4


def trained(tiny_lm_weights: dict, steps: int) -> list[dict]:
    """The weights of `steps` updates as an optimizer makes them: each moves every fp32 value by 2e-6, as
    Adam at lr 2e-6 does (bf16 keeps a few percent of those moves); one tensor is rescaled whole, one never
    changes."""
    gen = torch.Generator().manual_seed(0)
    master = {k: v.float().clone() for k, v in tiny_lm_weights.items()}
    names = sorted(master)
    out = []
    for step in range(steps):
        for name in names[1:]:
            master[name] += 2e-6 * torch.randn(master[name].shape, generator=gen).sign()
        master[names[-1]] *= 1.0 + 0.01 * (step + 1)
        out.append({k: v.to(torch.bfloat16) for k, v in master.items()})
    return out


def engine_bits(servicer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in servicer.backend.model.state_dict().items()}


def assert_same_engine(a, b) -> None:
    x, y = engine_bits(a), engine_bits(b)
    assert x.keys() == y.keys()
    for k in x:
        assert torch.equal(x[k].view(torch.int16), y[k].view(torch.int16)), k


@pytest.fixture(scope="module")
def pair(tiny_lm):
    """Two bf16 HF rollouts: one takes delta pushes, the other every push whole (the reference)."""
    started = [serve(tiny_lm, dtype="bfloat16") for _ in range(3)]
    yield started
    for servicer, server, client in started:
        client.close()
        server.stop(0)
        servicer.close()


def next_version(clients) -> int:
    return max(c.call("Describe").weight_version for c in clients) + 1


@pytest.mark.parametrize("transport", ["shm", "stream"])
@pytest.mark.parametrize("bucket", [16 << 10, 1 << 30], ids=["buckets", "whole"])
def test_a_delta_pushed_rollout_equals_a_fully_pushed_one(pair, tiny_lm, transport, bucket):
    (delta, _, to_delta), (full, _, to_full), _ = pair
    steps = trained(current_weights(tiny_lm), STEPS)
    base = Base()
    for step, named in enumerate(steps):
        v = next_version([to_delta, to_full])
        stats = weights.push_state(to_delta, named, v, transport, bucket_bytes=bucket, base=base)
        weights.push_state(to_full, named, v, transport, bucket_bytes=bucket)
        assert stats["delta"] == float(step > 0)  # the first starts the base
        if step:
            assert stats["sent_bytes"] < stats["num_bytes"] / 4, stats
        assert_same_engine(delta, full)
    probe = chats("6+7=", "9+9=")
    a = generate(to_delta, probe, temperature=0.0).data.batch["rollout_logprobs"]
    b = generate(to_full, probe, temperature=0.0).data.batch["rollout_logprobs"]
    assert torch.equal(a, b)


def test_a_chain_of_replicas_takes_the_delta_as_one_would(pair, tiny_lm):
    """stream down a chain (WeightBucket.relay_to): the actor sends each bucket's changes once, and both
    replicas end bit for bit where a replica fully pushed ends."""
    (one, _, c1), (ref, _, c_ref), (two, _, c2) = pair
    base = Base()
    for named in trained(current_weights(tiny_lm), 3):
        v = next_version([c1, c2, c_ref])
        buckets = weights.plan([(k, t.dtype, list(t.shape)) for k, t in named.items()], 16 << 10)
        tensors_of = lambda b, named=named: [named[r.name] for r in b.refs]  # noqa: E731
        push = weights.Push(v, "stream", relay=True, base=base, delta=True)
        _, failed = weights.push_to_all([c1, c2], buckets, tensors_of, push)
        assert not failed
        weights.push_state(c_ref, named, v, "stream")
    assert_same_engine(one, ref)
    assert_same_engine(two, ref)


def test_a_corrupted_base_is_caught_and_a_full_push_repairs_it(pair, tiny_lm):
    (delta, _, to_delta), (full, _, to_full), _ = pair
    first, second, third = trained(current_weights(tiny_lm), 3)
    base = Base()
    v = next_version([to_delta, to_full])
    weights.push_state(to_delta, first, v, "shm", base=base)
    name, (dtype, shape, offset) = next(iter(delta.receiver.base.where.items()))
    held = delta.receiver.base.segment.tensor(dtype, shape, offset)
    held.view(-1)[0] += 1.0  # the rollout's base drifts: the next delta would build on it
    expect(
        grpc.StatusCode.DATA_LOSS,
        lambda: weights.push_state(to_delta, second, v + 1, "shm", base=base),
        f"tensor {name!r} has checksum",
    )
    assert base.version == 0  # the push did not end: the next is full
    stats = weights.push_state(to_delta, third, v + 2, "shm", base=base)
    assert stats["delta"] == 0.0
    weights.push_state(to_full, third, v + 2, "shm")
    assert_same_engine(delta, full)


def test_a_replica_without_the_base_refuses_a_delta(pair, tiny_lm):
    """A rollout that took version v from another sender (no base kept) refuses a delta from v: ABORTED,
    and a full push of the same version goes in."""
    (delta, _, to_delta), _, _ = pair
    first, second = trained(current_weights(tiny_lm), 2)
    base = Base()
    v = next_version([to_delta])
    weights.push_state(to_delta, first, v, "stream", base=base)
    weights.push_state(to_delta, first, v + 1, "stream")  # a full push that keeps none: the base goes
    assert delta.receiver.base.segment is None
    base.version = v + 1  # as if the actor's base were at the rollout's version
    expect(
        grpc.StatusCode.ABORTED,
        lambda: weights.push_state(to_delta, second, v + 2, "stream", base=base),
        "holds no base",
    )
    assert base.version == 0  # every replica refused at Begin: the sender's base is no version's
    stats = weights.push_state(to_delta, second, v + 2, "stream", base=base)  # so the next push is full
    assert stats["delta"] == 0.0
    begin = rollout_pb2.BeginWeightUpdateRequest(
        version=v + 3, transport="shm", total_bytes=64, delta_base=v + 2, lora=rollout_pb2.LoraAdapter(rank=1)
    )
    expect(grpc.StatusCode.INVALID_ARGUMENT, lambda: to_delta.call("BeginWeightUpdate", begin), "full weights")


def test_a_replica_whose_base_fails_mid_chain_leaves_the_rest_of_the_chain_its_bucket(pair, tiny_lm):
    """The first replica of a chain finds its base corrupted (DATA_LOSS): it still passes every bucket on, so
    the replica after it takes the delta as it would have; only the first fails the push (and a full push
    repairs it, as Mesh._push_mending does)."""
    (one, _, c1), (ref, _, c_ref), (two, _, c2) = pair
    base = Base()
    steps = trained(current_weights(tiny_lm), 3)
    for i, named in enumerate(steps):
        v = next_version([c1, c2, c_ref])
        if i == 2:  # the first replica's base drifts before the last delta
            _, (dtype, shape, offset) = next(iter(one.receiver.base.where.items()))
            one.receiver.base.segment.tensor(dtype, shape, offset).view(-1)[0] += 1.0
        buckets = weights.plan([(k, t.dtype, list(t.shape)) for k, t in named.items()], 16 << 10)
        tensors_of = lambda b, named=named: [named[r.name] for r in b.refs]  # noqa: E731
        push = weights.Push(v, "stream", relay=True, base=base, delta=True)
        _, failed = weights.push_to_all([c1, c2], buckets, tensors_of, push)
        weights.push_state(c_ref, named, v, "stream")
    assert list(failed) == [c1.address], failed
    error = failed[c1.address]
    assert isinstance(error, ServiceError) and error.code == grpc.StatusCode.DATA_LOSS, error
    assert_same_engine(two, ref)
    weights.push_state(c1, steps[-1], v, "stream")  # the mending push: the whole weights of that version
    assert_same_engine(one, ref)
