"""Padding-free passes (services/actor/packing.py): the packed pass gives the padded pass's log-probs,
values and gradients, on a batch of rows of different lengths in verl's layout (left-padded prompts,
right-padded responses), also where rows share prompts (each run once), and a token budget counts real
tokens."""

import inspect
import json

import pytest
import torch
import transformers

from meshrl.dataproto import DataProto
from meshrl.models import load_model
from meshrl.tiny.models import TinyModelConfig, make_model
from services.actor import packing
from services.actor.batches import token_groups
from services.actor.model import forward_response, packed, token_logprobs
from testkit.packed import SMALL, batch, grouped


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma2", "gpt2"])
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


@pytest.mark.parametrize("share", [False, True])
def test_a_sequence_longer_than_a_sliding_window_runs_packed_within_the_window(tmp_path, share):
    """Gemma2's every other layer attends within a sliding window, which the packed attention applies (the
    window the layer passes it, services/actor/attention_extras.py): micro-batches within the window and one
    with a longer sequence both run packed and give the padded model's log-probs (HF's masks apply the
    window there)."""
    path = make_model(tmp_path / "g", TinyModelConfig(family="gemma2", **SMALL))  # type: ignore[arg-type]
    config = json.loads((path / "config.json").read_text())
    config["sliding_window"] = 16  # the tiny model's default window is far longer than its sequences
    (path / "config.json").write_text(json.dumps(config))
    padded, flat = load_model(str(path), "causal"), load_model(str(path), "causal")
    packing.enable(flat)
    vocab = padded.config.vocab_size
    long = batch([12, 12, 5, 5], [9, 4, 2, 3], vocab)  # 21 tokens > 16
    if share:  # rows 0 and 1 share their prompt (a GRPO group)
        width = long["input_ids"].shape[1] - long["responses"].shape[1]
        long["input_ids"][1, :width] = long["input_ids"][0, :width]
    calls = []
    kernel = packing.attention

    def counted(*a, **kw):  # a packed call: the sequences' boundaries, or the shared prompts' layout
        if kw.get("cu_seq_lens_q") is not None or kw.get("meshrl_shared") is not None:
            calls.append(1)
        return kernel(*a, **kw)

    transformers.AttentionInterface.register(packing.NAME, counted)
    try:
        for mb in (grouped(vocab), long):  # at most 9 + 7 tokens; then 21
            before = len(calls)
            a, b = (
                token_logprobs(forward_response(m, mb, share_prompts=share), mb["responses"]) for m in (padded, flat)
            )
            assert torch.allclose(a * mb["response_mask"], b * mb["response_mask"], atol=1e-5)
            packed_calls = len(calls) - before
            assert packed_calls > 0
    finally:
        transformers.AttentionInterface.register(packing.NAME, kernel)


def test_a_value_model_packed(tmp_path):
    path = make_model(tmp_path / "lm", TinyModelConfig(**SMALL))  # type: ignore[arg-type]
    padded, flat = load_model(str(path), "value"), load_model(str(path), "value")
    flat.load_state_dict(padded.state_dict())  # the new value head, the same on both
    packing.enable(flat)
    mb = batch([3, 8], [5, 2], 50, seed=1)
    a, b = (forward_response(m, mb)[..., 0] * mb["response_mask"] for m in (padded, flat))
    assert torch.allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_shared_prompts_packed_give_the_shared_passes_logprobs_and_gradients(tmp_path, family, monkeypatch):
    """Packing keeps prompt sharing: each distinct prompt once and every response padding-free in one pass,
    with the padded shared-prompt pass's log-probs and gradients (and with gradient checkpointing, which the
    padded one cannot take: HF drops its cache)."""
    path = make_model(tmp_path / family, TinyModelConfig(family=family, **SMALL))  # type: ignore[arg-type]
    padded, flat, checkpointed = (load_model(str(path), "causal") for _ in range(3))
    for model in (flat, checkpointed):
        packing.enable(model)
    checkpointed.gradient_checkpointing_enable()
    checkpointed.train()
    calls = []
    attend = packing.Shared.attend
    monkeypatch.setattr(packing.Shared, "attend", lambda self, *a: calls.append(1) or attend(self, *a))
    mb = grouped(padded.config.vocab_size)
    out = {}
    for name, model in (("padded", padded), ("packed", flat), ("checkpointed", checkpointed)):
        before = len(calls)
        lp = token_logprobs(forward_response(model, mb, share_prompts=True), mb["responses"])
        (-(lp * mb["response_mask"]).sum()).backward()
        out[name] = (lp * mb["response_mask"], {n: p.grad.clone() for n, p in model.named_parameters()})
        assert (len(calls) > before) == (name != "padded")  # the packed shared pass ran, once per layer
    for name in ("packed", "checkpointed"):
        assert torch.allclose(out["padded"][0], out[name][0], atol=1e-5)
        for n, g in out["padded"][1].items():
            assert torch.allclose(g, out[name][1][n], atol=1e-5), (name, n)


def test_a_packed_budget_counts_real_tokens():
    mb = batch([2, 2, 2, 2], [2, 2, 2, 30], 50)
    data = DataProto({k: mb[k] for k in ("input_ids", "attention_mask", "position_ids", "responses")})
    padded = token_groups(data, 44, packed=False)  # 2 x (2 + 30) > 44: the long row alone, then 3 rows of 4
    flat = token_groups(data, 44, packed=True)  # 32 + 4 + 4 + 4 = 44 real tokens: one pass
    assert [len(g) for g in padded] == [1, 3] and [len(g) for g in flat] == [4]


def test_a_packed_budget_with_shared_prompts_counts_each_prompt_once():
    mb = batch([10] * 8, [2, 2, 2, 20, 3, 3, 3, 3], 50)
    width = mb["input_ids"].shape[1] - mb["responses"].shape[1]
    for rows in ([0, 1, 2, 3], [4, 5, 6, 7]):
        mb["input_ids"][rows, :width] = mb["input_ids"][rows[0], :width]
    data = DataProto({k: mb[k] for k in ("input_ids", "attention_mask", "position_ids", "responses")})
    # two prompts of 10 tokens once each, and the responses' 38 real tokens: 58 (padded and shared: 2 x 10 + 8 x 20)
    assert [len(g) for g in token_groups(data, 58, shared=True, packed=True)] == [8]
    # one token less: the second prompt's last row (10 + 26 + 10 + 3 x 3 = 55, + 3 > 57) starts the next pass
    assert [len(g) for g in token_groups(data, 57, shared=True, packed=True)] == [7, 1]
    assert len(token_groups(data, 58, shared=True, packed=False)) > 1


def reference_varlen(  # noqa: PLR0913 - limit: the varlen kernel's own signature
    q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=(-1, -1), enable_gqa=False
):
    """What flash-attention's varlen kernel computes, one sequence at a time (the kernel runs on CUDA only):
    causal attention with each query sequence aligned to the end of its key sequence."""
    assert window_size == (-1, 0) and cu_q.dtype == cu_k.dtype == torch.int32
    assert max_q == int(cu_q.diff().max()) and max_k == int(cu_k.diff().max())
    out = []
    for i in range(len(cu_q) - 1):
        qs, ks, vs = (t[c[i] : c[i + 1]].transpose(0, 1) for t, c in ((q, cu_q), (k, cu_k), (v, cu_k)))
        if enable_gqa:
            ks, vs = (t.repeat_interleave(qs.shape[0] // t.shape[0], 0) for t in (ks, vs))
        seen = torch.ones(qs.shape[1], ks.shape[1], dtype=torch.bool).tril(ks.shape[1] - qs.shape[1])
        out.append(torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, attn_mask=seen, scale=scale))
    return torch.cat([o.transpose(0, 1) for o in out])


def kernel_2_11(  # noqa: PLR0913 - limit: the varlen kernel's own signature
    q, k, v, cu_q, cu_k, max_q, max_k, *, return_aux=None, scale=None, window_size=(-1, -1)
):
    """torch 2.11's varlen_attn: causal by window_size, no enable_gqa (k and v come with the query's heads)."""
    assert k.shape[1] == q.shape[1], "torch 2.11's kernel takes as many key heads as query heads"
    return reference_varlen(q, k, v, cu_q, cu_k, max_q, max_k, scale=scale, window_size=window_size)


def kernel_2_10(  # noqa: PLR0913 - limit: the varlen kernel's own signature
    query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None
):
    """torch 2.10's signature: is_causal, no scale (so the packed pass cannot use it: never called)."""
    raise AssertionError("torch 2.10's kernel takes no scale; the padded attention should run instead")


@pytest.mark.parametrize(
    "fails, torch_kernel",
    [(False, reference_varlen), (True, reference_varlen), (False, kernel_2_11), (False, kernel_2_10)],
)
def test_the_varlen_kernels_calls_give_the_padded_passes_results(tmp_path, monkeypatch, fails, torch_kernel):
    """The packed row's boundaries and gathered keys as the varlen kernel takes them (cu_seq_q/k, a response's
    keys its prompt's then its own), checked against the padded passes with a stand-in for the kernel, with
    the arguments of torch 2.13 (the pin), 2.11 (what the GPU machine here has: no enable_gqa) and 2.10
    (is_causal, no scale: not called); a kernel that fails is left for padded attention, with the same
    results."""
    path = make_model(tmp_path / "lm", TinyModelConfig(family="qwen2", **SMALL))  # type: ignore[arg-type]
    padded, flat = load_model(str(path), "causal"), load_model(str(path), "causal")
    packing.enable(flat)
    calls = []

    def kernel(*args, **kw):
        calls.append(1)
        if fails:
            raise RuntimeError("no kernel image is available for execution on the device")
        return torch_kernel(*args, **kw)

    kernel.__signature__ = inspect.signature(torch_kernel)  # type: ignore[attr-defined]
    monkeypatch.setattr(packing, "varlen_attn", kernel)
    monkeypatch.setattr(packing, "OFF", False)
    monkeypatch.setattr(packing, "kernel_runs", lambda q: not packing.OFF)
    vocab = padded.config.vocab_size
    for mb, share in ((batch([5, 9, 2, 7], [6, 1, 8, 3], vocab), False), (grouped(vocab), True)):
        before, out = len(calls), {}
        for name, model in (("padded", padded), ("packed", flat)):
            lp = token_logprobs(forward_response(model, mb, share_prompts=share), mb["responses"])
            (-(lp * mb["response_mask"]).sum()).backward()
            out[name] = (lp * mb["response_mask"], {n: p.grad.clone() for n, p in model.named_parameters()})
            model.zero_grad()
        assert torch.allclose(out["padded"][0], out["packed"][0], atol=1e-5)
        for n, g in out["padded"][1].items():
            assert torch.allclose(g, out["packed"][1][n], atol=1e-5), n
        assert len(calls) > before or fails or torch_kernel is kernel_2_10  # every layer's went through it
    if torch_kernel is kernel_2_10:
        assert not calls
    else:
        assert (len(calls) == 1) == fails  # a failing kernel is tried once, then padded from there on
