"""Routing replay (meshrl/algos/router_replay.py) on real tiny mixtures of experts: replaying a model's own
choices changes nothing (the weights are the router's, renormalized as each family does), and after the
routers move, every forward path (padded, padded with shared prompts, packed, packed with shared prompts)
replays the same experts (the same log-probs), which routing afresh does not give, while the routers
still get gradients."""

import pytest
import torch

from meshrl.algos.moe import routers
from meshrl.algos.router_replay import ROUTED, agreement, replay_of
from meshrl.layout import rollout_tensors
from meshrl.models import load_model
from meshrl.tiny.models import MOE, TinyModelConfig, make_model
from services.actor import packing
from services.actor.model import forward_response, record_routing, token_logprobs

SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2}


def grouped_batch(vocab: int) -> dict:
    """Six rows in verl's layout, rows 0-2 and 3-5 sharing a prompt (GRPO groups), every length different."""
    g = torch.Generator().manual_seed(0)
    draw = lambda n: torch.randint(3, vocab, (n,), generator=g).tolist()  # noqa: E731
    prompts = [draw(5)] * 3 + [draw(9)] * 3
    return rollout_tensors(prompts, [draw(n) for n in (4, 7, 1, 6, 3, 8)], 0)


@pytest.fixture(scope="module", params=MOE)
def folder(request, tmp_path_factory):
    cfg = TinyModelConfig(family=request.param, num_experts=4, **SMALL)  # type: ignore[arg-type]
    return make_model(tmp_path_factory.mktemp(request.param), cfg)


def logprobs(model, mb, share: bool) -> torch.Tensor:
    return token_logprobs(forward_response(model, mb, share_prompts=share), mb["responses"]) * mb["response_mask"]


def test_replaying_a_models_own_choices_changes_nothing(folder):
    model = load_model(str(folder), "causal")
    mb = grouped_batch(model.config.vocab_size)
    fresh = logprobs(model, mb, share=False)
    routed = record_routing(model, mb)
    assert routed.dtype == torch.uint8 and routed.shape == (*mb["input_ids"].shape, 2, 2)  # layers, top-k
    again = logprobs(model, {**mb, ROUTED: routed}, share=False)
    assert torch.allclose(again, fresh, atol=1e-6)
    assert replay_of(model).agreement() == {"actor/moe/routing_agreement": 1.0}


def test_every_path_replays_the_same_experts_and_the_router_still_learns(folder):
    padded, flat = load_model(str(folder), "causal"), load_model(str(folder), "causal")
    packing.enable(flat)
    mb = grouped_batch(padded.config.vocab_size)
    routed = record_routing(padded, mb)
    assert torch.equal(record_routing(flat, mb)[mb["attention_mask"].bool()], routed[mb["attention_mask"].bool()])
    g = torch.Generator().manual_seed(1)
    noise = [torch.randn(r.weight.shape, generator=g) for r in routers(padded)]
    for model in (padded, flat):  # the routers move (an update): afresh, some tokens pick other experts
        for r, n in zip(routers(model), noise):
            r.weight.data += 2 * n * r.weight.data.std()
    moved = record_routing(padded, mb)
    mask = mb["attention_mask"]
    assert agreement(moved, routed, mask) < 1
    replayed = {(kind, share): None for kind in ("padded", "packed") for share in (False, True)}
    for kind, share in replayed:
        model = padded if kind == "padded" else flat
        lp = logprobs(model, {**mb, ROUTED: routed}, share)
        replayed[kind, share] = lp
        assert 0 < replay_of(model).agreement()["actor/moe/routing_agreement"] < 1
    first = replayed["padded", False]
    for key, lp in replayed.items():
        assert torch.allclose(lp, first, atol=1e-5), key
    assert not torch.allclose(logprobs(padded, mb, share=False), first, atol=1e-5)  # afresh: other experts
    # the router's weights still get gradients for the experts they are given (R3's way)
    for r in routers(flat):
        r.weight.grad = None
    logprobs(flat, {**mb, ROUTED: routed}, share=True).sum().backward()
    assert all(r.weight.grad is not None and r.weight.grad.abs().sum() > 0 for r in routers(flat))


def test_a_replay_that_does_not_fit_the_pass_is_refused(folder):
    model = load_model(str(folder), "causal")
    mb = grouped_batch(model.config.vocab_size)
    wrong = record_routing(model, mb)[:, 1:]  # a column short
    with pytest.raises(ValueError, match="routing replay: the pass routes"):
        logprobs(model, {**mb, ROUTED: wrong}, share=False)


def test_a_checkpointed_recompute_replays_and_is_counted_once(folder):
    model = load_model(str(folder), "causal")
    model.gradient_checkpointing_enable()
    model.train()
    mb = grouped_batch(model.config.vocab_size)
    routed = record_routing(model, mb)
    replay = replay_of(model)
    replay.agreement()
    lp = logprobs(model, {**mb, ROUTED: routed}, share=False)
    counted = replay.agreement()
    lp.sum().backward()  # the recompute replays the same experts (else the shapes or gradients would differ)
    assert counted == {"actor/moe/routing_agreement": 1.0} and replay.agreement() == {}
    assert all(r.weight.grad is not None for r in routers(model))


def test_observing_counts_the_agreement_and_routes_afresh(folder):
    """router_agreement: the rollout's experts are compared with, not replayed."""
    model = load_model(str(folder), "causal")
    mb = grouped_batch(model.config.vocab_size)
    other = (record_routing(model, mb).long() + 1) % 4  # experts the model would not pick
    fresh = logprobs(model, mb, share=False)
    replay = replay_of(model)
    replay.observe = True
    try:
        seen = logprobs(model, {**mb, ROUTED: other.to(torch.uint8)}, share=False)
    finally:
        replay.observe = False
    assert torch.equal(seen, fresh) and replay.agreement() == {"actor/moe/routing_agreement": 0.0}
