"""The actor's model loading: dropout is off unless asked for, for every place HF keeps a rate."""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from services.actor.model import load_model


def gpt2(path):
    # GPT-2 ships resid/embd/attn dropout 0.1, the case a user hit: a non-zero ppo_kl on an on-policy epoch
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32)).save_pretrained(path)
    return path


def llama(path):
    LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                                 num_key_value_heads=1, vocab_size=64, attention_dropout=0.5)).save_pretrained(path)
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
