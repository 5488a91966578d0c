"""The response's log-probs and entropy by chunks of the head (services/actor/head.py): the same values and
gradients as the full-logits pass on every path (padded, shared prompts, packed, packed with shared
prompts), in several chunks or one, with tied embeddings; a model that changes its head's output (Gemma2's
soft-capping) keeps the full-logits pass; no (tokens x vocabulary) tensor of the whole micro-batch is
made."""

import math

import pytest
import torch

from meshrl.models import load_model
from meshrl.tiny.models import TinyModelConfig, make_model
from services.actor import head, packing
from services.actor.model import logprobs_and_entropy
from testkit.packed import SMALL, grouped


def full(model, mb, temperature, share):
    logits = head.forward_response(model, mb, share_prompts=share)
    return logprobs_and_entropy(logits, mb["responses"], temperature, True)


def run(model, mb, fn, temperature=0.7, share=False):
    """fn's log-probs and entropies on real tokens, and the gradients of a loss of both."""
    model.zero_grad()
    lp, ent = fn(model, mb, temperature, share)
    real = mb["attention_mask"][:, -mb["responses"].shape[1] :].bool()
    (-(lp[real]).sum() - 0.1 * ent[real].sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return lp[real].detach(), ent[real].detach(), grads


def chunked(model, mb, temperature, share):
    return head.response_logprobs(model, mb, temperature, share_prompts=share, entropy=True)


def same(a, b, atol=1e-5):
    assert torch.allclose(a[0], b[0], atol=atol) and torch.allclose(a[1], b[1], atol=atol)
    assert a[2].keys() == b[2].keys()
    for n, g in a[2].items():
        assert torch.allclose(g, b[2][n], atol=atol), n


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("share", [False, True])
def test_chunks_give_the_full_logits_values_and_gradients(tmp_path, monkeypatch, tied, packed, share):
    path = make_model(tmp_path / "m", TinyModelConfig(family="qwen2", tie_word_embeddings=tied, **SMALL))
    model = load_model(str(path), "causal")
    if packed:
        packing.enable(model)
    mb = grouped(model.config.vocab_size)
    expected = run(model, mb, full, share=share)
    made = []
    monkeypatch.setattr(head, "CHUNK_BYTES", 4 * model.config.vocab_size * 5)  # 5 tokens a chunk
    real_terms = head.head_terms
    monkeypatch.setattr(head, "head_terms", lambda *a: made.append(a[1].shape[0]) or real_terms(*a))
    same(run(model, mb, chunked, share=share), expected)
    real = int(mb["attention_mask"][:, -mb["responses"].shape[1] :].sum())
    # only real tokens went through the head, 5 at a time (each chunk run again in the backward)
    assert max(made) == 5 and sum(made) == 2 * real
    made.clear()
    monkeypatch.setattr(head, "CHUNK_BYTES", 2**30)  # one chunk: run once, nothing recomputed
    same(run(model, mb, chunked, share=share), expected)
    assert made == [real]
    assert model.get_output_embeddings() is not None and not hasattr(model, head.UNFUSED)


def test_without_gradients_the_chunks_are_not_kept(tmp_path, monkeypatch):
    path = make_model(tmp_path / "m", TinyModelConfig(family="llama", **SMALL))
    model = load_model(str(path), "causal")
    mb = grouped(model.config.vocab_size)
    monkeypatch.setattr(head, "CHUNK_BYTES", 4 * model.config.vocab_size * 3)
    with torch.no_grad():
        lp, ent = head.response_logprobs(model, mb, entropy=True)
        want, want_ent = full(model, mb, 1.0, False)
    real = mb["attention_mask"][:, -mb["responses"].shape[1] :].bool()
    assert torch.allclose(lp[real], want[real], atol=1e-5) and torch.allclose(ent[real], want_ent[real], atol=1e-5)
    assert (lp[~real] == 0).all() and (ent[~real] == 0).all()
    lp, ent = head.response_logprobs(model, mb)
    assert ent is None


def test_a_model_that_changes_its_heads_output_keeps_the_full_logits(tmp_path):
    """Gemma2 soft-caps its logits after the head: standing the head in would lose that, so the first pass
    finds it out and the model keeps the full-logits pass."""
    path = make_model(tmp_path / "g", TinyModelConfig(family="gemma2", **SMALL))
    model = load_model(str(path), "causal")
    assert model.config.final_logit_softcapping
    mb = grouped(model.config.vocab_size)
    expected = run(model, mb, full)
    same(run(model, mb, chunked), expected)
    assert getattr(model, head.UNFUSED)
    same(run(model, mb, chunked), expected)
    assert model.get_output_embeddings() is not None  # the head is back in place


def test_entropy_of_known_distributions():
    tokens = torch.zeros(1, dtype=torch.long)
    _, ent = logprobs_and_entropy(torch.zeros(1, 4), tokens, 1.0, True)
    assert ent.item() == pytest.approx(math.log(4))
    _, ent = logprobs_and_entropy(torch.tensor([[100.0, 0.0]]), tokens, 1.0, True)
    assert ent.item() == pytest.approx(0.0, abs=1e-6)
    lp, _ = logprobs_and_entropy(torch.tensor([[2.0, 0.0]]), tokens, 2.0, False)  # softmax([1, 0])
    assert lp.item() == pytest.approx(1 - math.log(math.e + 1))
