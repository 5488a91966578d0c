"""meshrl/algos/moe.py: the router's load-balancing loss, z-loss and expert load, worked by hand, and the
hooks that capture a real tiny Qwen3-MoE's routers through a forward and a backward."""

import math

import pytest
import torch

from meshrl.algos.moe import RouterCapture, expert_load, router_terms, routers, z_loss
from meshrl.tiny.models import TinyModelConfig, hf_config


@pytest.fixture(scope="module")
def model():
    from transformers import AutoModelForCausalLM

    cfg = TinyModelConfig(family="qwen3_moe", hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(hf_config(cfg, 50, 1, [2], 0))


def test_z_loss_and_expert_load_by_hand():
    # two tokens, two experts, logits 0: logsumexp = log 2 for each
    outputs = [(torch.zeros(2, 2), torch.tensor([[0], [0]])), (torch.zeros(2, 2), torch.tensor([[0], [1]]))]
    assert z_loss(outputs).item() == pytest.approx(math.log(2) ** 2)
    # layer 1: both tokens to expert 0 -> counts (2, 0), max/mean 2; layer 2: (1, 1) -> 1
    assert expert_load(outputs, 2) == {"actor/moe/load_max_over_mean": 1.5, "actor/moe/load_max_over_mean_worst": 2.0}


def test_the_balance_loss_is_switch_transformers(model):
    capture = RouterCapture(model)
    assert len(capture.routers) == 2 and len(routers(model)) == 2
    router = capture.routers[0]
    E, k = router.num_experts, router.top_k
    # every token routed to experts 0 and 1 (k = 2): f_0 = f_1 = 1 (tokens routed there over tokens), 0 else
    big = torch.tensor([[30.0, 20.0] + [0.0] * (E - 2)] * 4)
    capture.outputs = [(big, torch.topk(big, k).indices)]
    loss, m = router_terms(capture, 1.0, 0.0)
    probs = torch.softmax(big, -1).mean(0)
    assert k == 2 and float(loss) == pytest.approx(E * (probs[0] + probs[1]).item(), rel=1e-5)  # ~E: the worst
    even = torch.zeros(E, E)  # each expert's logits equal: P_e = 1/E, and whichever two take the slots, k
    capture.outputs = [(even, torch.stack([torch.arange(E), (torch.arange(E) + 1) % E], 1))]
    assert float(router_terms(capture, 1.0, 0.0)[0]) == pytest.approx(k)  # balanced: k
    assert m["actor/moe/load_max_over_mean"] == pytest.approx(E / 2)  # two experts take every slot


def test_the_routers_are_captured_through_a_forward_and_their_loss_reaches_their_weights(model):
    ids = torch.randint(3, 50, (2, 7))
    with RouterCapture(model) as capture:
        model(input_ids=ids)
        assert len(capture.outputs) == 2  # a layer each
        logits, experts = capture.outputs[0]
        assert logits.shape == (14, capture.routers[0].num_experts) and experts.shape == (14, 2)
        loss, m = router_terms(capture, 0.01, 0.001)
        assert set(m) == {
            "actor/moe/aux_loss",
            "actor/moe/z_loss",
            "actor/moe/load_max_over_mean",
            "actor/moe/load_max_over_mean_worst",
        }
        model.zero_grad()
        loss.backward()
        assert all(r.weight.grad is not None and r.weight.grad.abs().sum() > 0 for r in capture.routers)
    assert not capture.outputs and not capture.handles  # the hooks are gone after `with`
    model(input_ids=ids)
    assert not capture.outputs
