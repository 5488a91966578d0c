"""services/actor/lora.py against peft itself: the targets "all-linear" picks, the names an adapter push and
export use (peft's save names; HF names for merged weights), and the merged weights peft's own merge gives."""

import pytest
import torch

from meshrl.config.actor import EngineConfig
from meshrl.models import load_model, lora_target_modules
from services.actor import lora

LLAMA_LINEAR = ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]


def adapted(path, kind: str, **settings):
    cfg = EngineConfig(lora_rank=4, **settings)
    model = load_model(str(path), kind)
    targets = lora_target_modules(model, cfg)
    return lora.add_adapter(model, cfg, kind, targets), targets, cfg


@pytest.mark.parametrize("kind", ["causal", "value"])
def test_names_are_pefts_and_the_base_models(tiny_lm, kind):
    from peft import get_peft_model_state_dict

    peft, targets, _ = adapted(tiny_lm, kind)
    assert targets == LLAMA_LINEAR  # every linear layer of the blocks: not lm_head, not the value head
    keys = list(peft.state_dict())
    assert set(lora.adapter_view(keys).sources) == set(get_peft_model_state_dict(peft))
    assert set(lora.merged_view(keys, 1.0).sources) == set(load_model(str(tiny_lm), kind).state_dict())
    trained = {n for n, p in peft.named_parameters() if p.requires_grad}
    assert trained == {k for k in keys if lora.is_adapter(k)}  # the optimizer's: the adapter (+ value head)
    assert any("score" in k for k in trained) == (kind == "value")


def test_the_merged_view_is_pefts_merge(tiny_lm):
    peft, _, cfg = adapted(tiny_lm, "causal", lora_alpha=8.0)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.normal_()  # a fresh adapter merges to the base weights; this one does not
    sd = {k: v.clone() for k, v in peft.state_dict().items()}
    merged = lora.computed(lora.merged_view(list(sd), lora.scale(cfg)), sd)
    expected = peft.merge_and_unload().state_dict()
    assert merged.keys() == expected.keys()
    assert all(torch.equal(merged[k], expected[k]) for k in expected)


def test_a_list_of_targets_and_what_is_refused(tiny_lm):
    model = load_model(str(tiny_lm), "causal")
    assert lora_target_modules(model, EngineConfig(lora_rank=8, lora_target_modules="q_proj,v_proj")) == [
        "q_proj",
        "v_proj",
    ]
    for spec, rank, match in [
        ("all-linear", 129, r"lora_rank=129 is larger than model.layers.0.self_attn.k_proj \(128 x 256\)"),
        ("q_proj,qkv_proj", 4, "no module named 'qkv_proj'"),
        ("embed_tokens", 4, r"model.embed_tokens \(Embedding\) is not a linear layer"),
    ]:
        with pytest.raises(ValueError, match=match):
            lora_target_modules(model, EngineConfig(lora_rank=rank, lora_target_modules=spec))
    for bad in ("", "q proj", "q_proj,,v_proj", "all-linear,q_proj"):
        with pytest.raises(ValueError, match="lora_target_modules"):
            EngineConfig(lora_rank=4, lora_target_modules=bad)
    with pytest.raises(ValueError, match="lora_dropout"):
        EngineConfig(lora_rank=4, lora_dropout=1.0)
