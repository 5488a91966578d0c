"""Padding-free passes (services/actor/packing.py): the packed pass gives the padded pass's log-probs,
values and gradients, on a batch of rows of different lengths in verl's layout (left-padded prompts,
right-padded responses), and a token budget counts real tokens."""

import pytest
import torch

from meshrl.dataproto import DataProto
from meshrl.layout import rollout_tensors
from meshrl.models import load_model
from meshrl.tiny.models import TinyModelConfig, make_model
from services.actor import packing
from services.actor.batches import token_groups
from services.actor.model import forward_response, packed, token_logprobs

SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2}


def batch(prompts: list[int], responses: list[int], vocab: int, seed: int = 0) -> dict:
    """verl's layout (meshrl.layout.rollout_tensors: left-padded prompts, right-padded responses)."""
    g = torch.Generator().manual_seed(seed)
    draw = lambda n: torch.randint(3, vocab, (n,), generator=g).tolist()  # noqa: E731
    return rollout_tensors([draw(p) for p in prompts], [draw(r) for r in responses], 0)


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_packed_logprobs_and_gradients_are_the_padded_ones(tmp_path, family):
    path = make_model(tmp_path / family, TinyModelConfig(family=family, **SMALL))  # type: ignore[arg-type]
    padded, flat = load_model(str(path), "causal"), load_model(str(path), "causal")
    packing.enable(flat)
    assert packed(flat) and not packed(padded)
    mb = batch([5, 9, 2, 7], [6, 1, 8, 3], padded.config.vocab_size)
    out = {}
    for name, model in (("padded", padded), ("packed", flat)):
        lp = token_logprobs(forward_response(model, mb, share_prompts=True), mb["responses"])
        loss = -(lp * mb["response_mask"]).sum()
        loss.backward()
        out[name] = (lp * mb["response_mask"], {n: p.grad.clone() for n, p in model.named_parameters()})
    assert torch.allclose(out["padded"][0], out["packed"][0], atol=1e-5)
    for n, g in out["padded"][1].items():
        assert torch.allclose(g, out["packed"][1][n], atol=1e-5), n


def test_a_value_model_packed(tmp_path):
    path = make_model(tmp_path / "lm", TinyModelConfig(**SMALL))  # type: ignore[arg-type]
    padded, flat = load_model(str(path), "value"), load_model(str(path), "value")
    flat.load_state_dict(padded.state_dict())  # the new value head, the same on both
    packing.enable(flat)
    mb = batch([3, 8], [5, 2], 50, seed=1)
    a, b = (forward_response(m, mb)[..., 0] * mb["response_mask"] for m in (padded, flat))
    assert torch.allclose(a, b, atol=1e-5)


def test_shared_prompts_still_take_the_shared_pass(tmp_path):
    """A GRPO group's rows share their prompt: the shared-prompt pass runs (and agrees)."""
    path = make_model(tmp_path / "lm", TinyModelConfig(**SMALL))  # type: ignore[arg-type]
    padded, flat = load_model(str(path), "causal"), load_model(str(path), "causal")
    packing.enable(flat)
    mb = batch([6, 6, 6, 6], [4, 2, 5, 1], padded.config.vocab_size)
    mb["input_ids"][:, :6] = mb["input_ids"][0, :6]  # one prompt, four samples
    a, b = (token_logprobs(forward_response(m, mb, share_prompts=True), mb["responses"]) for m in (padded, flat))
    assert torch.allclose(a * mb["response_mask"], b * mb["response_mask"], atol=1e-5)


def test_a_packed_budget_counts_real_tokens():
    mb = batch([2, 2, 2, 2], [2, 2, 2, 30], 50)
    data = DataProto({k: mb[k] for k in ("input_ids", "attention_mask", "position_ids", "responses")})
    padded = token_groups(data, 44, packed=False)  # 2 x (2 + 30) > 44: the long row alone, then 3 rows of 4
    flat = token_groups(data, 44, packed=True)  # 32 + 4 + 4 + 4 = 44 real tokens: one pass
    assert [len(g) for g in padded] == [1, 3] and [len(g) for g in flat] == [4]
