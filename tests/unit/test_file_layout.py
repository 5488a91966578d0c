"""meshrl/file_layout.py: a mixture of experts' tensors between the model folder's layout (per expert) and
transformers' in memory (fused), both ways, by transformers' own conversions; dense models untouched."""

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from meshrl import file_layout
from meshrl.tiny.models import MOE, TinyModelConfig, make_model

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
