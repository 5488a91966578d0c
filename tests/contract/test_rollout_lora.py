"""LoRA adapters pushed to the rollout service, HF backend (peft): generation follows the adapter in use,
a later adapter replaces it, full weights drop it, and a bad adapter changes nothing."""

import grpc
import pytest
import torch
from calls import expect, serve
from lora_adapters import ADAPTER_EFFECT, TOLERANCE, base_model, gap, generate, make_adapter, next_version, push_adapter

from meshrl import weights
from meshrl.v1 import rollout_pb2


@pytest.fixture(scope="module")
def rollout(tiny_lm):
    servicer, server, client = serve(tiny_lm, max_lora_rank=8)
    yield client
    server.stop(0)
    servicer.close()


@pytest.mark.parametrize("transport", ["shm", "stream"])
def test_an_adapter_push_generates_as_peft_does(rollout, tiny_lm, transport):
    model, named, lora = make_adapter(tiny_lm, seed=1)
    v = next_version(rollout)
    stats = push_adapter(rollout, named, lora, v, transport)
    assert stats["num_bytes"] == sum(t.numel() * 4 for t in named.values())
    info = rollout.call("Describe")
    assert info.weight_version == v and info.details["lora_rank"] == "8" and info.details["lora_version"] == str(v)
    got = generate(rollout)
    assert got.msg.weight_version == v
    assert gap(model, got.data) < TOLERANCE
    assert gap(base_model(tiny_lm), got.data) > ADAPTER_EFFECT  # the adapter is what made the difference


def test_a_later_adapter_replaces_the_first_whatever_its_shape(rollout, tiny_lm):
    first, named, lora = make_adapter(tiny_lm, seed=2)
    push_adapter(rollout, named, lora, next_version(rollout), bucket_bytes=64 << 10)  # several buckets
    assert gap(first, generate(rollout).data) < TOLERANCE
    second, named, lora = make_adapter(tiny_lm, seed=3)  # same shape: copied into the same layers
    push_adapter(rollout, named, lora, next_version(rollout))
    got = generate(rollout).data
    assert gap(second, got) < TOLERANCE and gap(first, got) > ADAPTER_EFFECT
    third, named, lora = make_adapter(tiny_lm, seed=4, rank=4, targets=["q_proj", "v_proj"])
    v = next_version(rollout)
    push_adapter(rollout, named, lora, v)
    assert gap(third, generate(rollout).data) < TOLERANCE
    assert rollout.call("Describe").details["lora_rank"] == "4"


def test_full_weights_drop_the_adapter(rollout, tiny_lm):
    base = base_model(tiny_lm)
    _, named, lora = make_adapter(tiny_lm, seed=5)
    push_adapter(rollout, named, lora, next_version(rollout))
    v = next_version(rollout)
    weights.push_state(rollout, base.state_dict(), v, "shm")  # the base weights again, as a merged push would
    info = rollout.call("Describe")
    assert info.weight_version == v and info.details["lora_rank"] == "0" and info.details["lora_version"] == "0"
    assert gap(base, generate(rollout).data) < TOLERANCE
    _, named, lora = make_adapter(tiny_lm, seed=5)  # and an adapter again after them
    push_adapter(rollout, named, lora, next_version(rollout), bucket_bytes=64 << 10)
    assert gap(base, generate(rollout).data) > ADAPTER_EFFECT


def test_bad_adapters_change_nothing(rollout, tiny_lm):
    model, named, lora = make_adapter(tiny_lm, seed=6)
    push_adapter(rollout, named, lora, next_version(rollout))
    before = generate(rollout)
    info = rollout.call("Describe")
    v = info.weight_version + 1
    bad, old = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION

    _, big, big_lora = make_adapter(tiny_lm, seed=6, rank=16)
    expect(old, lambda: push_adapter(rollout, big, big_lora, v), "rollout.max_lora_rank 8")
    other = rollout_pb2.LoraAdapter(rank=8, alpha=16, target_modules=["c_attn"])  # GPT-2's
    expect(bad, lambda: push_adapter(rollout, named, other, v), "target_modules ['c_attn']")
    shorthand = rollout_pb2.LoraAdapter(rank=8, alpha=16, target_modules=["all-linear"])
    expect(bad, lambda: push_adapter(rollout, named, shorthand, v), "names peft resolved 'all-linear' to")
    renamed = {k.replace("model.layers.", "transformer.h."): t for k, t in named.items()}
    expect(bad, lambda: push_adapter(rollout, renamed, lora, v), "'base_model.model.transformer.h.0.")
    key = next(iter(named))
    wider = {**named, key: torch.zeros(8, 512)}  # an adapter of a wider model of the same architecture
    expect(bad, lambda: push_adapter(rollout, wider, lora, v), "has shape [8, 512]")
    fewer = {k: t for k, t in named.items() if ".layers.3." not in k}
    expect(bad, lambda: push_adapter(rollout, fewer, lora, v), "adapter tensor(s) missing")
    for rank, alpha, match in ((0, 16, "rank must be >= 1"), (8, 0, "alpha must be a positive")):
        empty = rollout_pb2.LoraAdapter(rank=rank, alpha=alpha, target_modules=lora.target_modules)
        expect(bad, lambda empty=empty: push_adapter(rollout, named, empty, v), match)

    after = generate(rollout)
    assert rollout.call("Describe").details == info.details
    assert after.msg.weight_version == before.msg.weight_version
    assert torch.equal(after.data.batch["responses"], before.data.batch["responses"])
    assert torch.equal(after.data.batch["rollout_logprobs"], before.data.batch["rollout_logprobs"])
    assert gap(model, after.data) < TOLERANCE


def test_an_adapter_outlives_sleep(rollout, tiny_lm):
    model, named, lora = make_adapter(tiny_lm, seed=7)
    rollout.call("Sleep", rollout_pb2.SleepRequest(level=1))
    rollout.call("WakeUp", rollout_pb2.SleepRequest(tags=["weights"]))
    push_adapter(rollout, named, lora, next_version(rollout))
    rollout.call("WakeUp", rollout_pb2.SleepRequest())
    assert gap(model, generate(rollout).data) < TOLERANCE
    rollout.call("Sleep", rollout_pb2.SleepRequest(level=1))
    rollout.call("WakeUp", rollout_pb2.SleepRequest())
    assert gap(model, generate(rollout).data) < TOLERANCE


def test_a_rollout_without_lora_support_refuses_an_adapter(tiny_lm):
    servicer, server, client = serve(tiny_lm)
    try:
        _, named, lora = make_adapter(tiny_lm, seed=8)
        expect(
            grpc.StatusCode.FAILED_PRECONDITION,
            lambda: push_adapter(client, named, lora, 1),
            "started without LoRA support: start it with rollout.max_lora_rank >= 8",
        )
        info = client.call("Describe")
        assert info.weight_version == 0 and info.details["lora_rank"] == "0"
        assert '"max_lora_rank": 0' in info.details["settings"]
        assert generate(client).msg.weight_version == 0
    finally:
        server.stop(0)
        servicer.close()
