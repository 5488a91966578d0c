"""The packed passes apply what a layer adds to causal attention (services/actor/attention_extras.py):
gpt-oss's attention sinks, Gemma-2's logit soft-cap, sliding windows (also Gemma-3's, whose config keeps
it in text_config), each against the model's own eager attention padded; a keyword the packed attention
does not know is refused. Tiny models from transformers' own config classes (hidden 64, 2 layers)."""

import inspect
from typing import Any

import pytest
import torch
import transformers

from meshrl.models import load_model
from services.actor import packing
from services.actor.model import forward_response, token_logprobs
from testkit.packed import batch, grouped

SIZES: dict[str, Any] = {
    "vocab_size": 96,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 256,
}


def gpt_oss(window: int):
    """gpt-oss: sinks on every layer (drawn large, so they take much of the softmax), a window on the first."""
    config = transformers.GptOssConfig(**SIZES, num_local_experts=4, num_experts_per_tok=2, sliding_window=window)
    model = transformers.GptOssForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("sinks"):
                p.normal_(0.0, 1.0)
    return model


def gemma2(window: int):
    """Gemma-2 with a soft-cap small enough to bite on a tiny model's logits."""
    config = transformers.Gemma2Config(
        **SIZES, sliding_window=window, attn_logit_softcapping=0.01, query_pre_attn_scalar=16
    )
    return transformers.Gemma2ForCausalLM(config)


def gemma3_vl(window: int):
    """Gemma-3's vision-language model: the sliding window sits in text_config (rows without pictures)."""
    text = {**SIZES, "sliding_window": window, "layer_types": ["sliding_attention", "full_attention"]}
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}
    config = transformers.Gemma3Config(
        text_config=text,
        vision_config={**vision, "image_size": 28, "patch_size": 14},
        mm_tokens_per_image=1,
        image_token_index=95,
        boi_token_index=94,
        eoi_token_index=93,
    )
    return transformers.Gemma3ForConditionalGeneration(config)


def mistral(window: int):
    """Mistral: a sliding window on every layer and nothing else, which flash-attention's kernel takes."""
    return transformers.MistralForCausalLM(transformers.MistralConfig(**SIZES, sliding_window=window))


def passes(model: torch.nn.Module, mb: dict, share: bool):
    lp = token_logprobs(forward_response(model, mb, share_prompts=share), mb["responses"]) * mb["response_mask"]
    (-lp.sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    return lp, grads


def eager_and_packed(tmp_path, build):
    """The family's tiny model (a window of 8) twice: with its eager attention, and packed."""
    torch.manual_seed(0)
    build(8).save_pretrained(str(tmp_path))
    eager, flat = load_model(str(tmp_path), "causal"), load_model(str(tmp_path), "causal")
    eager.set_attn_implementation("eager")
    packing.enable(flat)
    return eager, flat


@pytest.mark.parametrize("build", [gpt_oss, gemma2, gemma3_vl])
def test_packed_passes_give_the_eager_padded_ones(tmp_path, build):
    """Rows of up to 16 tokens, a window of 8: packed (shared prompts or not) equals the model's eager
    attention padded, log-probs and gradients (the sinks' too)."""
    eager, flat = eager_and_packed(tmp_path, build)
    for share, mb in ((False, batch([5, 9, 2, 7], [6, 1, 8, 3], 90)), (True, grouped(90))):
        (want, want_grads), (got, got_grads) = passes(eager, mb, share), passes(flat, mb, share)
        assert (want - got).abs().max() < 1e-5
        assert want_grads.keys() == got_grads.keys()
        for name, g in want_grads.items():
            assert torch.allclose(g, got_grads[name], atol=1e-5), name


def test_a_padded_call_keeps_the_sinks(tmp_path):
    """A call without the packed row's boundaries (a padded pass through the packed model) runs gpt-oss's own
    eager attention, sinks and all, over SDPA's masks."""
    torch.manual_seed(0)
    gpt_oss(128).save_pretrained(str(tmp_path))
    eager, flat = load_model(str(tmp_path), "causal"), load_model(str(tmp_path), "causal")
    packing.enable(flat)
    mb = batch([5, 9, 2, 7], [6, 1, 8, 3], 90)
    for mask in (mb["attention_mask"], torch.ones_like(mb["attention_mask"])):  # padded; none (SDPA: is_causal)
        want, got = (m(input_ids=mb["input_ids"], attention_mask=mask).logits for m in (eager, flat))
        assert torch.allclose(want[mask.bool()], got[mask.bool()], atol=1e-5)


def test_what_the_packed_attention_cannot_apply_is_refused():
    module = torch.nn.Module()
    q = torch.randn(1, 2, 5, 4)
    bounds = torch.tensor([0, 2, 5], dtype=torch.int32)
    out, _ = packing.attention(module, q, q, q, packing.PACKED, cu_seq_lens_q=bounds, max_length_q=3, softcap=None)
    assert out.shape == (1, 5, 2, 4)
    with pytest.raises(ValueError, match="position_bias"):
        packing.attention(module, q, q, q, packing.PACKED, cu_seq_lens_q=bounds, position_bias=torch.zeros(1))
    with pytest.raises(ValueError, match="bidirectional"):
        packing.attention(module, q, q, q, packing.PACKED, cu_seq_lens_q=bounds, is_causal=False)


def windowed_varlen(  # noqa: PLR0913 - limit: the varlen kernel's own signature
    q, k, v, cu_q, cu_k, max_q, max_k, *, return_aux=None, scale=None, window_size=(-1, -1), enable_gqa=False
):
    """What flash-attention's varlen kernel computes, one sequence at a time (it runs on CUDA only): each
    query sequence aligned to the end of its keys, a query seeing keys at most window_size[0] back."""
    left, right = window_size
    assert right == 0 and enable_gqa
    out = []
    for i in range(len(cu_q) - 1):
        qs, ks, vs = (t[c[i] : c[i + 1]].transpose(0, 1) for t, c in ((q, cu_q), (k, cu_k), (v, cu_k)))
        ks, vs = (t.repeat_interleave(qs.shape[0] // t.shape[0], 0) for t in (ks, vs))
        at = torch.arange(qs.shape[1])[:, None] + ks.shape[1] - qs.shape[1]
        keys = torch.arange(ks.shape[1])[None]
        seen = (keys <= at) & ((left < 0) | (keys >= at - left))
        out.append(torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, attn_mask=seen, scale=scale))
    return torch.cat([o.transpose(0, 1) for o in out])


@pytest.mark.parametrize("build", [mistral, gpt_oss])
def test_the_varlen_kernel_takes_windows_and_leaves_sinks_to_the_padded_attention(tmp_path, monkeypatch, build):
    """On CUDA a window goes to flash-attention's varlen kernel as window_size=(window - 1, 0) (checked here
    with a stand-in computing what the kernel does); a layer with sinks, which the kernel cannot add, lays
    its sequences side by side instead. Both give the eager padded pass's log-probs."""
    calls = []

    def kernel(*args, **kw):
        calls.append(kw["window_size"])
        return windowed_varlen(*args, **kw)

    kernel.__signature__ = inspect.signature(windowed_varlen)  # type: ignore[attr-defined]
    monkeypatch.setattr(packing, "varlen_attn", kernel)
    monkeypatch.setattr(packing, "kernel_runs", lambda q: True)
    eager, flat = eager_and_packed(tmp_path, build)
    for share, mb in ((False, batch([5, 9, 2, 7], [6, 1, 8, 3], 90)), (True, grouped(90))):
        (want, _), (got, _) = passes(eager, mb, share), passes(flat, mb, share)
        assert (want - got).abs().max() < 1e-5
    assert set(calls) == ({(7, 0)} if build is mistral else set())
