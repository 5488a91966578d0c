"""LoRA on a mixture of experts' experts (actor.lora_experts): peft's ParamWrapper on the fused expert tensors,
a rank-r pair per expert; the merged view the pushes and the export send equals peft's own merge, for every
family; what is adapted and what is refused."""

import copy

import pytest
import torch

from meshrl.config.actor import EngineConfig, EngineSettings
from meshrl.config.checked import FieldError
from meshrl.models import load_model, lora_target_modules, lora_target_parameters
from meshrl.tiny.models import MOE, TinyModelConfig, make_model
from services.actor import lora

SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2}


def adapted(tmp_path, family, **cfg):
    path = make_model(tmp_path / family, TinyModelConfig(family=family, num_experts=4, **SMALL))
    model = load_model(str(path), "causal")
    engine = EngineConfig(lora_rank=4, lora_alpha=8, lora_experts=True, **cfg)
    targets, params = lora_target_modules(model, engine), lora_target_parameters(model, engine)
    peft = lora.add_adapter(model, engine, "causal", targets, params)
    with torch.no_grad():  # lora_B starts at zero: give the adapter something to merge
        g = torch.Generator().manual_seed(0)
        for n, p in peft.named_parameters():
            if ".lora_B." in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return peft, engine, targets, params


@pytest.mark.parametrize("family", MOE)
def test_the_merged_view_is_peft_s_own_merge(tmp_path, family):
    peft, engine, targets, params = adapted(tmp_path, family)
    assert params == ["experts.down_proj", "experts.gate_up_proj"]
    assert "shared_expert_gate" not in targets  # a one-output gate: no rank fits it
    experts = lora.expert_adapters(peft)
    assert len(experts) == 2 * 2  # two tensors in each of two layers
    trained = {n for n, p in peft.named_parameters() if p.requires_grad}
    assert trained and all(".lora_A." in n or ".lora_B." in n for n in trained)
    assert {a for a, _, _ in experts.values()} <= trained  # every expert pair trains, the experts do not
    held = peft.state_dict()
    got = lora.computed(lora.merged_view(list(held), lora.scale(engine), experts), held)
    want = copy.deepcopy(peft).merge_and_unload().state_dict()
    assert got.keys() == want.keys()
    for name, t in want.items():
        assert torch.allclose(got[name], t, atol=1e-6), name
    moved = [n for n in experts if not torch.equal(held[n], got[lora.hf_name(n)])]
    assert len(moved) == len(experts)  # the adapter changed every adapted expert tensor
    ids = torch.randint(3, 60, (2, 9), generator=torch.Generator().manual_seed(1))
    merged = copy.deepcopy(peft).merge_and_unload()
    merged.load_state_dict(got)
    logits = peft(input_ids=ids).logits
    assert torch.allclose(merged(input_ids=ids).logits, logits, atol=1e-5)
    logits.logsumexp(-1).mean().backward()  # the experts' pairs get gradients through the routed tokens
    grads = dict(peft.named_parameters())
    assert all(grads[a].grad is not None and grads[a].grad.abs().sum() > 0 for a, _, _ in experts.values())


def test_what_lora_experts_refuses(tmp_path):
    path = make_model(tmp_path / "q", TinyModelConfig(family="qwen3_moe", num_experts=4, **SMALL))
    model = load_model(str(path), "causal")
    with pytest.raises(ValueError, match="Set actor.lora_experts=true"):
        lora_target_modules(model, EngineSettings(lora_rank=4))  # all-linear would skip the experts
    assert lora_target_modules(model, EngineSettings(lora_rank=4, lora_target_modules="q_proj")) == ["q_proj"]
    with pytest.raises(ValueError, match=r"lora_rank=200 is larger than each expert"):
        lora_target_parameters(model, EngineSettings(lora_rank=200, lora_experts=True))
    dense = load_model(str(make_model(tmp_path / "d", TinyModelConfig(family="qwen3", **SMALL))), "causal")
    with pytest.raises(ValueError, match="lora_experts=true: .* is not a mixture of experts"):
        lora_target_parameters(dense, EngineSettings(lora_rank=4, lora_experts=True))
    with pytest.raises(FieldError, match="lora_experts=true needs lora_dropout=0"):
        EngineSettings(lora_rank=4, lora_experts=True, lora_dropout=0.1)


def test_the_exported_adapter_folder_loads_in_peft(tmp_path):
    """`run_dir/hf_adapter` (lora.save_adapter from the adapter's saved names): PeftModel.from_pretrained on
    the base folder gives the trained model's logits, the experts' pairs included."""
    from peft import PeftModel

    peft, _, _, _ = adapted(tmp_path, "qwen3_moe")
    held = peft.state_dict()
    lora.save_adapter(
        tmp_path / "adapter", peft, str(tmp_path / "qwen3_moe"), lora.computed(lora.adapter_view(list(held)), held)
    )
    back = PeftModel.from_pretrained(load_model(str(tmp_path / "qwen3_moe"), "causal"), str(tmp_path / "adapter"))
    ids = torch.randint(3, 60, (2, 9), generator=torch.Generator().manual_seed(2))
    assert torch.allclose(back(input_ids=ids).logits, peft(input_ids=ids).logits, atol=1e-5)
