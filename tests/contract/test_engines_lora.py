"""LoRA on every engine (actor.lora_rank), on real gloo process groups: each against the plain engine.

The same step as tests/contract/test_engines.py (forward, token-mean NLL backward, AdamW step) with a
rank-8 adapter on every linear layer of the blocks: only the adapter moves, the adapter-off pass is the
base model's, a push carries the adapter alone under peft's names (or the merged weights under HF names),
and a checkpoint holds the adapter and its optimizer state only.
"""

import pytest
import torch
from engine_ranks import P, batch
from engine_runs import run
from transformers import AutoModelForCausalLM

RANK, ALPHA = 8, 16.0
PREFIX = "base_model.model."


def hf_logprobs(model) -> torch.Tensor:
    b = batch()
    with torch.no_grad():
        logits = model(
            input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]
        ).logits[:, P - 1 : -1]
    return torch.log_softmax(logits, -1).gather(-1, b["responses"].unsqueeze(-1)).squeeze(-1)


@pytest.fixture(scope="module")
def base(tiny_lm):
    return AutoModelForCausalLM.from_pretrained(tiny_lm)


@pytest.fixture(scope="module")
def plain(tiny_lm, tmp_path_factory):
    return run(1, "plain", tiny_lm, tmp_path_factory.mktemp("lora-plain"), "--lora", str(RANK))


def peft_names(model) -> set[str]:
    """The names peft's own save_pretrained writes for this adapter."""
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

    fresh = AutoModelForCausalLM.from_config(model.config)
    config = LoraConfig(task_type="CAUSAL_LM", r=RANK, lora_alpha=ALPHA, target_modules="all-linear")
    return set(get_peft_model_state_dict(get_peft_model(fresh, config)))


def test_only_the_adapter_trains_and_the_base_model_stays_reachable(plain, base):
    before, after = hf_logprobs(base), plain["logprobs"]
    # lora_B starts at 0: the first pass is the base model's, so the loss is the base model's NLL
    mask = batch()["response_mask"]
    assert plain["stats"]["loss"] == pytest.approx(float(-(before * mask).sum() / mask.sum()), rel=1e-6)
    assert torch.allclose(plain["base_logprobs"], before, atol=1e-6)  # the adapter off, after the step
    assert not torch.allclose(after, before, atol=1e-3)  # the step moved the adapter-on log-probs
    w = plain["weights"]
    for name, value in base.state_dict().items():  # every base weight exactly as loaded
        key = PREFIX + name if PREFIX + name in w else PREFIX + name.removesuffix("weight") + "base_layer.weight"
        assert torch.equal(w[key], value), name
    assert any(k.endswith("lora_B.default.weight") and w[k].abs().sum() > 0 for k in w)


def test_the_push_is_the_adapter_under_peft_names(plain, base):
    pushed, w = plain["pushed"], plain["weights"]
    assert set(pushed) == peft_names(base)
    for name, t in pushed.items():
        module_key = name.replace(".lora_A.", ".lora_A.default.").replace(".lora_B.", ".lora_B.default.")
        assert torch.equal(t, w[module_key]), name
    adapter = sum(t.numel() * t.element_size() for t in pushed.values())
    full = sum(t.numel() * t.element_size() for t in base.state_dict().values())
    assert adapter * 15 < full, (adapter, full)  # 0.59 MB against 11.8 MB for the tiny model at rank 8


def test_merge_lora_pushes_the_merged_weights_under_hf_names(plain, base):
    merged, w = plain["merged"], plain["weights"]
    assert set(merged) == set(base.state_dict())
    changed = 0
    for name, value in base.state_dict().items():
        stem = PREFIX + name.removesuffix("weight")
        if f"{stem}lora_A.default.weight" in w:
            a, b = w[f"{stem}lora_A.default.weight"], w[f"{stem}lora_B.default.weight"]
            assert torch.allclose(merged[name], value + (ALPHA / RANK) * b @ a, atol=1e-6), name
            changed += not torch.equal(merged[name], value)
        else:
            assert torch.equal(merged[name], value), name
    assert changed == 4 * 7  # every linear layer of the 4 blocks
    model = AutoModelForCausalLM.from_config(base.config)
    model.load_state_dict(merged)
    assert torch.allclose(hf_logprobs(model), plain["logprobs"], atol=1e-5)


@pytest.mark.parametrize(
    "engine,flags",
    # each engine once, the options spread over them (one 2-rank run costs ~10 s of the suite here)
    [("fsdp2", ["--grad-ckpt", "--share"]), ("fsdp1", ["--grad-ckpt"]), ("fsdp2", ["--hsdp", "2"])],
    ids=["fsdp2-gradient-checkpointing-shared", "fsdp1-gradient-checkpointing", "hsdp"],
)
def test_two_ranks_match_one_process(plain, tiny_lm, tmp_path, engine, flags):
    two = run(2, engine, tiny_lm, tmp_path, "--lora", str(RANK), *flags)
    assert two["stats"]["loss"] == pytest.approx(plain["stats"]["loss"], rel=1e-6)
    assert two["stats"]["grad_norm"] == pytest.approx(plain["stats"]["grad_norm"], rel=1e-5)
    assert torch.allclose(two["logprobs"], plain["logprobs"], atol=1e-5)
    assert torch.allclose(two["base_logprobs"], plain["base_logprobs"], atol=1e-6)  # the adapter off
    for kind in ("weights", "pushed", "merged"):
        assert set(two[kind]) == set(plain[kind]), kind
        for k in plain[kind]:  # AdamW's first step is ~lr * sign(grad): a sign flip of a ~0 gradient at most
            assert (two[kind][k] - plain[kind][k]).abs().max() <= 2.5e-3, (kind, k)
    assert two["shared"] and all(s == {"gpus": ["rank-0", "rank-1"], "same": True} for s in two["shared"])


def test_mixed_precision_stays_close(plain, tiny_lm, tmp_path):
    mixed = run(2, "fsdp2", tiny_lm, tmp_path, "--lora", str(RANK), "--mixed-precision")
    assert mixed["stats"]["loss"] == pytest.approx(plain["stats"]["loss"], rel=1e-2)  # bf16 forward
    assert torch.allclose(mixed["logprobs"], plain["logprobs"], atol=0.1)


def test_checkpoint_holds_the_adapter_and_exports_both_folders(plain, base, tiny_lm, tmp_path):
    from peft import PeftModel

    ckpt, hf = tmp_path / "ckpt", tmp_path / "hf"
    trained = run(
        2, "fsdp2", tiny_lm, tmp_path / "train", "--lora", str(RANK), "--save", str(ckpt), "--export", str(hf)
    )
    saved = sum(f.stat().st_size for f in (ckpt / "dcp").iterdir())
    full = sum(t.numel() * t.element_size() for t in base.state_dict().values())
    assert saved < full / 3, saved  # adapter + its two AdamW moments, no base weights
    loaded = run(2, "fsdp2", tiny_lm, tmp_path / "load", "--lora", str(RANK), "--load", str(ckpt))
    assert torch.equal(loaded["logprobs"], trained["logprobs"])  # a fresh engine, the same model
    merged = AutoModelForCausalLM.from_pretrained(hf)  # a plain HF model, no peft
    assert torch.allclose(hf_logprobs(merged), trained["logprobs"], atol=1e-5)
    adapter = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_lm), str(hf) + "_adapter")
    assert torch.allclose(hf_logprobs(adapter), trained["logprobs"], atol=1e-5)
