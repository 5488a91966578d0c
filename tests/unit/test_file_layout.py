"""Mixtures of experts, the parts without services: meshrl/file_layout.py moves their tensors between the
model folder's layout (per expert) and transformers' in memory (fused), both ways, by transformers' own
conversions (dense models untouched); LoRA settings that would miss the experts are refused."""

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from meshrl import file_layout
from meshrl.config.actor import EngineSettings
from meshrl.models import check_lora
from meshrl.tiny.models import MOE, TinyModelConfig, make_model
from orchestrator.config import load_config
from orchestrator.lifecycle.preflight import check_rollout, check_router
from orchestrator.sampling import combinations

SMALL = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_layers": 2,
    "num_heads": 2,
    "num_kv_heads": 1,
    "num_experts": 4,
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("layouts")
    return {f: make_model(root / f, TinyModelConfig(family=f, **SMALL)) for f in (*MOE, "qwen2")}


@pytest.mark.parametrize("family", MOE)
def test_an_moe_converts_between_its_files_and_memory_exactly(folders, family):
    files = load_file(folders[family] / "model.safetensors")
    model = AutoModelForCausalLM.from_pretrained(folders[family])
    memory = model.state_dict()
    assert set(files) != set(memory) and any(".experts.0." in k for k in files)
    shell = file_layout.shell(model.config)  # what the actor uses: no weights, the family's conversions
    assert file_layout.converts(shell)
    out = file_layout.to_files(shell, memory)
    assert set(out) == set(files) and all(torch.equal(out[k], files[k]) for k in files)
    back = file_layout.to_memory(model, files)
    assert set(back) == set(memory) and all(torch.equal(back[k], memory[k]) for k in memory)
    # a push plans by names and shapes alone, one memory tensor at a time: meta tensors
    for name, t in memory.items():
        for f, m in file_layout.to_files(shell, {name: torch.empty(t.shape, device="meta")}).items():
            assert list(m.shape) == list(files[f].shape), f


def test_a_layer_with_an_expert_missing_does_not_fit(folders):
    files = load_file(folders["qwen3_moe"] / "model.safetensors")
    model = AutoModelForCausalLM.from_pretrained(folders["qwen3_moe"])
    layer = {k: v for k, v in files.items() if ".layers.1." in k and ".experts.3." not in k}
    fused = file_layout.to_memory(model, layer)["model.layers.1.mlp.experts.down_proj"]
    assert fused.shape != model.state_dict()["model.layers.1.mlp.experts.down_proj"].shape  # the caller refuses it


def test_a_dense_model_is_untouched(folders):
    model = AutoModelForCausalLM.from_pretrained(folders["qwen2"])
    shell = file_layout.shell(model.config)
    assert not file_layout.converts(shell)
    sd = model.state_dict()
    assert file_layout.to_files(shell, sd) is sd and file_layout.to_memory(model, sd) is sd


def test_lora_on_an_moe_is_refused_where_it_would_silently_miss_the_experts(folders):
    """all-linear would adapt attention alone (the experts are 3-d tensors, the router no nn.Linear), and
    vLLM's LoRA fails on an MoE at its first Generate: both refused before anything starts, in one line."""
    folder = str(folders["qwen3_moe"])
    with pytest.raises(ValueError, match=r"all-linear: Qwen3MoeForCausalLM's experts \(down_proj, gate_up_proj\)"):
        check_lora(folder, "causal", EngineSettings(lora_rank=8))
    assert check_lora(folder, "causal", EngineSettings(lora_rank=8, lora_target_modules="q_proj,v_proj"))
    run = ["actor.model=" + folder, "actor.lora_rank=8", "actor.lora_target_modules=q_proj,v_proj"]
    with pytest.raises(ValueError, match="set rollout.merge_lora=true"):
        check_rollout(load_config(None, [*run, "rollout.backend=vllm"]))
    check_rollout(load_config(None, [*run, "rollout.backend=vllm", "rollout.merge_lora=true"]))
    check_rollout(load_config(None, [*run, "rollout.backend=hf"]))
    check_rollout(load_config(None, ["actor.model=" + str(folders["qwen2"]), "actor.lora_rank=8"]))


def test_a_router_loss_or_replay_on_a_dense_model_is_refused(folders):
    dense = "actor.model=" + str(folders["qwen2"])
    with pytest.raises(ValueError, match="router_z_loss_coef=0.001: .* is not a mixture of experts"):
        check_router(load_config(None, [dense, "actor.router_z_loss_coef=0.001"]))
    check_router(load_config(None, ["actor.model=" + str(folders["mixtral"]), "actor.router_aux_loss_coef=0.01"]))
    with pytest.raises(ValueError, match="router_replay=r2: .* is not a mixture of experts"):
        check_router(load_config(None, [dense, "actor.router_replay=r2"]))
    check_router(load_config(None, ["actor.model=" + str(folders["mixtral"]), "actor.router_replay=r2"]))
    with pytest.raises(ValueError, match="router_replay"):
        load_config(None, [dense, "actor.router_replay=r9"])
    moe = "actor.model=" + str(folders["mixtral"])
    check_router(load_config(None, [moe, "actor.router_replay=r3", "rollout.backend=hf"]))
    with pytest.raises(ValueError, match="router_replay=r3 with rollout.backend=vllm: vLLM 0.32 captures"):
        check_router(load_config(None, [moe, "actor.router_replay=r3"]))  # this machine has no GPU
    with pytest.raises(ValueError, match="router_agreement=True: .* is not a mixture of experts"):
        check_router(load_config(None, [dense, "actor.router_agreement=true"]))
    with pytest.raises(ValueError, match="router_agreement=true with rollout.backend=vllm"):
        check_router(load_config(None, [moe, "actor.router_agreement=true"]))
    with pytest.raises(ValueError, match="router_agreement.*with router_replay=r2"):
        load_config(None, [moe, "actor.router_agreement=true", "actor.router_replay=r2"])
    with pytest.raises(ValueError, match="a multi-turn or agent episode"):  # the episode samplers refuse it
        combinations.check(
            load_config(None, [moe, "actor.router_replay=r3", "rollout.backend=hf", "rollout.multi_turn=true"]), "grpo"
        )
