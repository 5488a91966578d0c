"""A weight push carries persistent buffers, and the hf rollout takes them: DeepSeek-V3's router keeps its
e_score_correction_bias as a buffer (in the files and in state_dict, not in named_parameters()), and a
push of every tensor the actor holds lands in the hf rollout's model, that buffer included. A tiny
DeepSeek-V3 from transformers' own config class (hidden 64, 2 layers, the first dense)."""

import torch
import transformers

from meshrl import file_layout
from meshrl.config.rollout import RolloutConfig
from meshrl.models import load_model, weight_tensors
from meshrl.tiny.tokenizer import save_tokenizer
from services.rollout.backend_hf import HFBackend
from services.rollout.weights import checkpoint_shapes

BIAS = "model.layers.1.mlp.gate.e_score_correction_bias"


def deepseek_v3(folder) -> None:
    tokenizer = save_tokenizer(folder)
    config = transformers.DeepseekV3Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_shared_experts=1,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=1,
        q_lora_rank=32,
        kv_lora_rank=32,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=16,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    transformers.DeepseekV3ForCausalLM(config).save_pretrained(str(folder))


def test_a_push_carries_the_routers_correction_bias_into_the_hf_rollout(tmp_path):
    deepseek_v3(tmp_path)
    actor = load_model(str(tmp_path), "causal")
    assert BIAS not in dict(actor.named_parameters()) and BIAS in weight_tensors(actor)  # a persistent buffer
    held = actor.state_dict()  # what the actor engine pushes (Engine.weight_tensors)
    torch.manual_seed(1)
    with torch.no_grad():  # an update: every tensor moves, the buffer too (as an aux-loss-free balancer moves it)
        for t in held.values():
            t.add_(0.1 * torch.randn_like(t))
    sent = file_layout.to_files(file_layout.shell(actor.config), dict(held))  # the files' names, experts split
    assert set(sent) == set(checkpoint_shapes(str(tmp_path)))  # what the rollout's receiver expects, no more
    rollout = HFBackend(RolloutConfig(model=str(tmp_path), backend="hf", max_model_len=64))
    assert not torch.equal(rollout.model.state_dict()[BIAS], held[BIAS])
    rollout._copy_in(sent.items())
    got = rollout.model.state_dict()
    for name, t in held.items():
        assert torch.equal(got[name], t), name
