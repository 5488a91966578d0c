"""meshrl/moe_facts.py: experts, top-k and MoE layers read from each family's config spellings (and its
text_config), the routers found where they sit, checked against the model's own structure (built on the
meta device: no weights); and routing replay of a router's own choice gives its own output in every
family (softmax, sigmoid, DeepSeek-V3's scaled sigmoid, Llama-4's (scores, logits)). Tiny configs from
transformers' own config classes."""

from typing import Any, cast

import pytest
import torch
import transformers

from meshrl import file_layout
from meshrl.algos import router_replay
from meshrl.models import is_moe
from meshrl.moe_facts import Facts, facts, routers
from services.actor.batches import routing_shape

SIZES: dict[str, Any] = {
    "vocab_size": 96,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
}
MLA: dict[str, Any] = {
    "q_lora_rank": 32,
    "kv_lora_rank": 32,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 16,
    "num_key_value_heads": 4,  # multi-head latent attention: as many as the query heads
    "head_dim": 8,  # its rotary part (qk_rope_head_dim), as DeepseekV3Config sets it
}
# family -> (its config, the facts it holds)
CASES: dict[str, tuple[Any, Facts]] = {
    "qwen3_moe": (  # every second layer sparse, layer 3 kept dense
        lambda: transformers.Qwen3MoeConfig(
            **SIZES,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=64,
            decoder_sparse_step=2,
            mlp_only_layers=[3],
        ),
        Facts(8, 2, (1,)),
    ),
    "mixtral": (
        lambda: transformers.MixtralConfig(**SIZES, num_local_experts=4, num_experts_per_tok=2),
        Facts(4, 2, (0, 1, 2, 3)),
    ),
    "deepseek_v3": (
        lambda: transformers.DeepseekV3Config(
            **{**SIZES, **MLA},
            n_routed_experts=6,
            num_experts_per_tok=3,
            moe_intermediate_size=64,
            n_group=1,
            topk_group=1,
            first_k_dense_replace=1,
        ),
        Facts(6, 3, (1, 2, 3)),
    ),
    "glm4_moe": (
        lambda: transformers.Glm4MoeConfig(
            **SIZES,
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=64,
            n_group=1,
            topk_group=1,
            first_k_dense_replace=2,
        ),
        Facts(4, 2, (2, 3)),
    ),
    "llama4_text": (
        lambda: transformers.Llama4TextConfig(
            **SIZES, num_local_experts=4, num_experts_per_tok=1, intermediate_size_mlp=128, interleave_moe_layer_step=2
        ),
        Facts(4, 1, (1, 3)),
    ),
    "ernie4_5_moe": (
        lambda: transformers.Ernie4_5_MoeConfig(
            **SIZES, moe_num_experts=4, moe_k=2, moe_intermediate_size=64, moe_layer_start_index=1, moe_layer_interval=1
        ),
        Facts(4, 2, (1, 2, 3)),
    ),
    "hunyuan_v1_moe": (
        lambda: transformers.HunYuanMoEV1Config(**SIZES, num_experts=4, moe_topk=2),
        Facts(4, 2, (0, 1, 2, 3)),
    ),
    "gpt_oss": (
        lambda: transformers.GptOssConfig(**SIZES, num_local_experts=4, num_experts_per_tok=2),
        Facts(4, 2, (0, 1, 2, 3)),
    ),
    "olmoe": (
        lambda: transformers.OlmoeConfig(**SIZES, num_experts=4, num_experts_per_tok=2),
        Facts(4, 2, (0, 1, 2, 3)),
    ),
    "minimax_m2": (
        lambda: transformers.MiniMaxM2Config(**SIZES, num_local_experts=4, num_experts_per_tok=2),
        Facts(4, 2, (0, 1, 2, 3)),
    ),
}


@pytest.mark.parametrize("family", list(CASES))
def test_the_facts_of_each_familys_config(family):
    make, want = CASES[family]
    config = make()
    assert facts(config) == want  # the transformers config
    assert facts(config.to_dict()) == want  # its config.json
    assert facts({"model_type": "vl", "text_config": config.to_dict()}) == want  # inside a vision-language one
    assert is_moe(config) and routing_shape(config.to_dict()) == (len(want.layers), want.top_k, want.num_experts)


@pytest.mark.parametrize("family", list(CASES))
def test_the_routers_sit_in_the_moe_layers_the_facts_name(family):
    config = CASES[family][0]()
    model = file_layout.shell(config)  # the meta device: no weights
    found = routers(model)
    layers = [i for i, layer in enumerate(model.model.layers) if any(m is r for m in layer.modules() for r in found)]
    want = facts(config)
    assert want is not None and tuple(layers) == want.layers
    sizes = [(cast(Any, r).num_experts, cast(Any, r).top_k) for r in found]  # int attributes of every router
    assert sizes == [(want.num_experts, want.top_k)] * len(want.layers)


def test_dense_models_and_unknown_spellings():
    assert facts(transformers.LlamaConfig(**SIZES)) is None and not is_moe({"num_hidden_layers": 2})
    assert facts({"num_hidden_layers": 2, "num_experts": 0}) is None
    with pytest.raises(ValueError, match="no top-k"):
        facts({"num_hidden_layers": 2, "num_experts": 4})
    # Hunyuan may list them per layer: equal ones are one number, unequal ones refused
    assert facts({"num_hidden_layers": 2, "num_experts": [4, 4], "moe_topk": [2, 2]}) == Facts(4, 2, (0, 1))
    with pytest.raises(ValueError, match="differs per layer"):
        facts({"num_hidden_layers": 2, "num_experts": 4, "moe_topk": [1, 2]})


@pytest.mark.parametrize("family", list(CASES))
def test_replaying_a_routers_own_choice_gives_its_own_output(family):
    """Record what each router chooses, replay it: the replayed weights are recomputed from the logits by the
    router's own rule (moe.weight_rule), so the logits are the same; replaying other experts changes them."""
    config = CASES[family][0]()
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # a non-zero bias: the choice is not the weights' top-k
                buffer.normal_(0.0, 0.1)
    ids = torch.randint(3, 90, (2, 7))
    replay = router_replay.replay_of(model)
    assert replay is not None and len(replay.routers) == len(facts(config).layers)  # type: ignore[union-attr]
    replay.recording = True
    own = model(input_ids=ids).logits
    chosen = replay.take()
    replay.recording = False
    replay.feed(chosen)
    again = model(input_ids=ids).logits
    assert torch.allclose(own, again, atol=1e-5)
    replay.feed((chosen + 1) % facts(config).num_experts)  # type: ignore[union-attr]  # other experts
    assert not torch.allclose(own, model(input_ids=ids).logits, atol=1e-5)
