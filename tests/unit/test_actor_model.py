"""The actor's model loading: dropout is off unless asked for, for every place HF keeps a rate."""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from meshrl.models import load_model
from testkit.batches import grouped


def gpt2(path):
    # GPT-2 ships resid/embd/attn dropout 0.1, the case a user hit: a non-zero ppo_kl on an on-policy epoch
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32)).save_pretrained(path)
    return path


def llama(path):
    LlamaForCausalLM(
        LlamaConfig(
            num_hidden_layers=2,
            hidden_size=32,
            intermediate_size=64,
            num_attention_heads=2,
            num_key_value_heads=1,
            vocab_size=64,
            attention_dropout=0.5,
        )
    ).save_pretrained(path)
    return path


@pytest.mark.parametrize("make", [gpt2, llama], ids=["gpt2", "llama"])
@pytest.mark.parametrize("kind", ["causal", "value"])
def test_training_passes_are_deterministic_unless_dropout_is_asked_for(tmp_path, make, kind):
    path = make(tmp_path / "m")
    ids = torch.randint(0, 64, (2, 16))

    def two_passes(model):
        model.train()  # the engine trains in train mode (gradient checkpointing needs it)
        with torch.no_grad():
            return [model(input_ids=ids).logits for _ in range(2)]

    a, b = two_passes(load_model(str(path), kind))
    assert torch.equal(a, b)
    a, b = two_passes(load_model(str(path), kind, dropout=True))
    assert not torch.equal(a, b)


@pytest.mark.parametrize("make", [gpt2, llama], ids=["gpt2", "llama"])
def test_a_shared_prompt_gives_the_full_pass_outputs_and_gradients(tmp_path, make):
    """Rows that share a prompt run it once (forward_response(share_prompts=True)): the same log-probs and
    the same gradient as every row running its whole sequence."""
    from services.actor.model import forward_response, prompt_sharing, token_logprobs

    model = load_model(str(make(tmp_path / "m")), "causal")
    mb = grouped([6, 3, 4], [[5, 1, 3, 2], [5, 5, 0, 4], [1, 2, 3, 4]])
    assert prompt_sharing(mb, 5) is not None  # 3 prompts for 12 rows: the shared path runs
    mask = mb["response_mask"]
    weights = torch.randn(mask.shape, generator=torch.Generator().manual_seed(1))
    outs = []
    for share in (False, True):
        model.zero_grad()
        lp = token_logprobs(forward_response(model, mb, share_prompts=share), mb["responses"])
        (lp * weights * mask).sum().backward()
        outs.append((lp * mask, torch.cat([p.grad.flatten() for p in model.parameters()])))
    (lp_full, g_full), (lp_shared, g_shared) = outs
    assert torch.allclose(lp_shared, lp_full, atol=1e-5)
    assert torch.allclose(g_shared, g_full, atol=1e-5, rtol=1e-4) and g_full.abs().sum() > 0


def test_prompts_are_shared_only_where_enough_rows_repeat_one():
    from services.actor.model import prompt_sharing

    assert prompt_sharing(grouped([6, 3, 4, 5], [[1], [2], [3], [4]]), 5) is None  # no prompt repeats
    assert prompt_sharing(grouped([6, 3, 4, 5], [[1, 2], [3], [4], [5]]), 5) is None  # 1 of 5 saved: too few
    first, inverse = prompt_sharing(grouped([6, 3], [[1, 2, 5], [3, 4]]), 5)
    assert first.tolist() == [0, 3] or first.tolist() == [3, 0]
    assert inverse[first].tolist() == [0, 1] and inverse.tolist()[:3] == [inverse[0]] * 3


def test_a_value_model_loads_without_transformers_warning_table(tiny_lm, capfd):
    """The critic's head is new and the LM head unused by design: no red LOAD REPORT on the console."""
    model = load_model(str(tiny_lm), "value")
    assert model.score.weight.shape[0] == 1
    assert "LOAD REPORT" not in capfd.readouterr().err
