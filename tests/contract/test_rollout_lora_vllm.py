"""LoRA adapters pushed to a vLLM rollout (rollout.max_lora_rank > 0), loaded from memory: the same adapter
gives the same greedy text as the HF backend with peft, and the log-probs peft gives; full weights drop it;
a bad adapter changes nothing. One engine for the module (~25 s to start on CPU with LoRA on)."""

import grpc
import pytest
import torch
from calls import ROLLOUT as SERVICE
from calls import expect, serve
from lora_adapters import ADAPTER_EFFECT, TOLERANCE, base_model, gap, generate, make_adapter, next_version, push_adapter

from meshrl import weights
from meshrl.rpc import Client
from meshrl.v1 import rollout_pb2
from orchestrator.lifecycle.services import launch

pytest.importorskip("vllm")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def vllm(tiny_lm):
    args = ["rollout", "--model", str(tiny_lm), "--backend", "vllm", "--max-model-len", "64", "--max-lora-rank", "8"]
    proc, address = launch(args)
    yield Client(address, SERVICE, timeout=300)
    proc.terminate()
    assert proc.wait(120) == 0


@pytest.fixture(scope="module")
def hf(tiny_lm):
    servicer, server, client = serve(tiny_lm, max_lora_rank=8)
    yield client
    server.stop(0)
    servicer.close()


def push_both(clients, named, lora, **kw):
    for client in clients:
        push_adapter(client, named, lora, next_version(client), **kw)


@pytest.mark.parametrize("transport", ["shm", "stream"])
def test_the_same_adapter_gives_the_same_text_as_hf_and_peft(vllm, hf, tiny_lm, transport):
    model, named, lora = make_adapter(tiny_lm, seed=11)
    push_both((vllm, hf), named, lora, transport=transport)
    info = vllm.call("Describe")
    assert info.details["lora_rank"] == "8" and info.details["lora_version"] == str(info.weight_version)
    greedy = [generate(c, n=1, temperature=0.0, max_new_tokens=12).data for c in (vllm, hf)]
    assert greedy[0].non_tensor_batch["response_text"].tolist() == greedy[1].non_tensor_batch["response_text"].tolist()
    assert torch.equal(greedy[0].batch["responses"], greedy[1].batch["responses"])
    sampled = generate(vllm).data
    assert gap(model, sampled) < TOLERANCE
    assert gap(base_model(tiny_lm), sampled) > ADAPTER_EFFECT


def test_adapters_replace_each_other_and_full_weights_drop_them(vllm, tiny_lm):
    base = base_model(tiny_lm)
    first, named, lora = make_adapter(tiny_lm, seed=12)
    push_adapter(vllm, named, lora, next_version(vllm), bucket_bytes=64 << 10)  # several buckets
    assert gap(first, generate(vllm).data) < TOLERANCE
    second, named, lora = make_adapter(tiny_lm, seed=13, rank=4, targets=["q_proj", "v_proj", "down_proj"])
    push_adapter(vllm, named, lora, next_version(vllm))
    got = generate(vllm).data
    assert gap(second, got) < TOLERANCE and gap(first, got) > ADAPTER_EFFECT
    weights.push_state(vllm, base.state_dict(), next_version(vllm), "shm")
    assert vllm.call("Describe").details["lora_rank"] == "0"
    assert gap(base, generate(vllm).data) < TOLERANCE
    push_adapter(vllm, named, lora, next_version(vllm))  # and an adapter on top of them again
    assert gap(second, generate(vllm).data) < TOLERANCE


def test_a_bad_adapter_changes_nothing(vllm, tiny_lm):
    model, named, lora = make_adapter(tiny_lm, seed=14)
    push_adapter(vllm, named, lora, next_version(vllm))
    before = generate(vllm).data
    info = vllm.call("Describe")
    v = info.weight_version + 1
    _, big, big_lora = make_adapter(tiny_lm, seed=14, rank=16)
    expect(grpc.StatusCode.FAILED_PRECONDITION, lambda: push_adapter(vllm, big, big_lora, v), "rollout.max_lora_rank")
    renamed = {k.replace("model.layers.", "transformer.h."): t for k, t in named.items()}
    expect(grpc.StatusCode.INVALID_ARGUMENT, lambda: push_adapter(vllm, renamed, lora, v), "transformer.h.0.")
    after = generate(vllm).data
    assert vllm.call("Describe").details == info.details
    assert torch.equal(after.batch["responses"], before.batch["responses"])
    assert gap(model, after) < TOLERANCE


def test_a_colocated_engine_takes_an_adapter_while_its_kv_cache_sleeps(vllm, tiny_lm):
    """A colocated run's order: asleep while the actor trains, weights woken to take the adapter, then the rest;
    the adapter outlives a later sleep too."""
    model, named, lora = make_adapter(tiny_lm, seed=15)
    vllm.call("Sleep", rollout_pb2.SleepRequest(level=1))
    vllm.call("WakeUp", rollout_pb2.SleepRequest(tags=["weights"]))
    push_adapter(vllm, named, lora, next_version(vllm))
    vllm.call("WakeUp", rollout_pb2.SleepRequest())
    assert gap(model, generate(vllm).data) < TOLERANCE
    vllm.call("Sleep", rollout_pb2.SleepRequest(level=1))
    vllm.call("WakeUp", rollout_pb2.SleepRequest())
    assert gap(model, generate(vllm).data) < TOLERANCE
