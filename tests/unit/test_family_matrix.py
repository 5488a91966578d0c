"""The family matrix (bench/family_matrix.py, docs/families.md) over a few representative families: each trained
at parity (packed and padded passes, the hf rollout after a push, within 1e-5 in fp32) or refused in one line.
The whole registry is the benchmark's; these are the families meshrl was built on, the ones whose attention or
routing differs (sinks, windows, MLA and sigmoid routing), a hybrid measured padded and refused families."""

import pytest

from testkit.family_parity import measure

PARITY = ["llama", "qwen3", "gemma3_text", "gpt_oss", "qwen3_moe", "deepseek_v3", "qwen2_vl"]


@pytest.mark.parametrize("family", PARITY)
def test_a_family_trains_at_parity(tmp_path, family):
    v = measure(family, tmp_path)
    assert v.verdict == "parity", (v.verdict, v.note)
    assert v.packed is not None and v.packed <= 1e-5 and v.rollout is not None and v.rollout <= 1e-5


@pytest.mark.parametrize(
    "family",
    [
        "gemma3",  # a tied head the push names language_model.lm_head.weight (skipped by the receiver)
        "biogpt",  # a tied head named output_projection.weight
        "video_llama_3",  # a forward that takes no logits_to_keep and hands it on to its attention
        "exaone4_5",  # positions its generate computes on the first call: no shared prefill on the hf rollout
    ],
)
def test_a_family_the_matrix_found_broken_trains_at_parity(tmp_path, family):
    v = measure(family, tmp_path)
    assert v.verdict == "parity", (v.verdict, v.note)


def test_a_pushed_tied_head_is_named_as_the_files_name_it():
    from meshrl import file_layout
    from testkit.tiny_families import tiny_config

    assert file_layout.tied(file_layout.shell(tiny_config("gemma3", 103))) == {"language_model.lm_head.weight"}
    assert file_layout.tied(file_layout.shell(tiny_config("llama", 103))) == set()  # untied


def test_a_hybrid_is_refused_packing_and_at_parity_padded(tmp_path):
    """Qwen3-Next's linear-attention layers: refused packed passes (which do leak: run anyway, they differ) and
    shared-prompt padded passes, at parity with the refusals' way out."""
    v = measure("qwen3_next", tmp_path)
    assert v.verdict == "parity (actor.padding_free=false, actor.share_prompts=false)", (v.verdict, v.note)
    assert v.note.startswith("actor.model is qwen3_next (Qwen3NextForCausalLM): actor.padding_free=true")
    assert v.checked[0].startswith("packed: differs") and v.rollout is not None and v.rollout <= 1e-5


@pytest.mark.parametrize("family", ["bart", "paligemma"])
def test_a_family_meshrl_cannot_train_is_refused_in_one_line(tmp_path, family):
    v = measure(family, tmp_path)
    assert v.verdict == "refused" and "\n" not in v.note and v.note.startswith(f"actor.model is {family} ")
