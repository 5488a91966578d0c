"""Tiny local models and data: HF loads them, the tokenizer round-trips, the data has verl's schema."""

import subprocess
import sys

import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from meshrl.tiny.arithmetic import ArithmeticConfig, make_data, problems
from meshrl.tiny.models import TinyModelConfig, make_model, num_parameters


def test_causal_lm_loads_and_runs(tiny_lm):
    model = AutoModelForCausalLM.from_pretrained(tiny_lm)
    tok = AutoTokenizer.from_pretrained(tiny_lm)
    assert 2_500_000 < num_parameters(model) < 4_000_000
    assert model.config.model_type == "llama" and not model.config.tie_word_embeddings
    ids = tok("12+7=", return_tensors="pt")["input_ids"]
    logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], model.config.vocab_size)
    assert len(tok) <= model.config.vocab_size


def test_tokenizer_is_char_level_and_round_trips(tiny_lm):
    tok = AutoTokenizer.from_pretrained(tiny_lm)
    text = "12+7=19\nWhat is -3*4? {ok}"
    ids = tok(text)["input_ids"]
    assert len(ids) == len(text)  # one token per character, newline included
    assert tok.decode(ids) == text
    assert tok.padding_side == "left"
    assert tok.decode([tok.unk_token_id]) == "<unk>"
    assert tok("é")["input_ids"] == [tok.unk_token_id]


def test_chat_template_marks_roles_and_ends_assistant_turns(tiny_lm):
    tok = AutoTokenizer.from_pretrained(tiny_lm)
    prompt = tok.apply_chat_template([{"role": "user", "content": "3+4="}], tokenize=False, add_generation_prompt=True)
    assert prompt == "<|user|>3+4=\n<|assistant|>"
    full = tok.apply_chat_template(
        [{"role": "user", "content": "3+4="}, {"role": "assistant", "content": "7"}], tokenize=False
    )
    assert full.endswith("<|assistant|>7</s>\n")
    ids = tok(prompt)["input_ids"]
    assert ids[0] == tok.convert_tokens_to_ids("<|user|>") and ids[-1] == tok.convert_tokens_to_ids("<|assistant|>")


def test_left_padding_batch(tiny_lm):
    tok = AutoTokenizer.from_pretrained(tiny_lm)
    b = tok(["1+1=", "10+10="], padding=True, return_tensors="pt")
    assert b["input_ids"][0, 0] == tok.pad_token_id and b["attention_mask"][0].tolist() == [0, 0, 1, 1, 1, 1]


def test_reward_model_scores_a_batch(tiny_rm):
    model = AutoModelForSequenceClassification.from_pretrained(tiny_rm)
    tok = AutoTokenizer.from_pretrained(tiny_rm)
    b = tok(["1+1=2", "2+2=5 is wrong"], padding=True, return_tensors="pt")
    assert model(**b).logits.shape == (2, 1)


def test_models_are_seeded(tmp_path):
    a = make_model(tmp_path / "a", TinyModelConfig(hidden_size=64, num_layers=1, seed=3))
    b = make_model(tmp_path / "b", TinyModelConfig(hidden_size=64, num_layers=1, seed=3))
    c = make_model(tmp_path / "c", TinyModelConfig(hidden_size=64, num_layers=1, seed=4))
    wa, wb, wc = (load_file(p / "model.safetensors") for p in (a, b, c))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not all(torch.equal(wa[k], wc[k]) for k in wa)


def test_bad_model_config_is_refused(tmp_path):
    with pytest.raises(ValueError, match="kind must be one of"):
        make_model(tmp_path, TinyModelConfig(kind="vision"))
    with pytest.raises(ValueError, match="must divide"):
        make_model(tmp_path, TinyModelConfig(hidden_size=100, num_heads=3))


def test_data_has_verl_schema(arithmetic_data):
    schema = pq.read_schema(arithmetic_data["train"])
    assert set(schema.names) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    assert str(schema.field("prompt").type) == "list<element: struct<role: string, content: string>>"
    assert schema.field("reward_model").type.get_field_index("ground_truth") >= 0
    df = pd.read_parquet(arithmetic_data["train"])
    assert len(df) == 300
    row = df.iloc[0]
    assert row["data_source"] == "arithmetic" and row["ability"] == "math"
    assert row["prompt"][0]["role"] == "user"
    question, answer = row["extra_info"]["question"], row["reward_model"]["ground_truth"]
    assert row["prompt"][0]["content"] == question and row["extra_info"]["answer"] == answer
    assert str(eval(question.rstrip("="))) == answer  # noqa: S307 - our own digits and operators


def test_test_split_is_disjoint_and_seeded():
    cfg = ArithmeticConfig(num_train=500, num_test=100, max_operand=30, seed=1)
    train, test = problems(cfg)
    assert not set(train) & set(test) and len(set(test)) == 100
    assert problems(cfg) == (train, test)
    assert problems(ArithmeticConfig(num_train=500, num_test=100, max_operand=30, seed=2)) != (train, test)


def test_small_problem_space_draws_with_replacement():
    train, test = problems(ArithmeticConfig(num_train=100, num_test=10, max_operand=3, ops="+"))
    assert len(train) == 100 and not set(train) & set(test)


@pytest.mark.parametrize(
    "cfg,match",
    [
        (ArithmeticConfig(ops="/"), "ops must be"),
        (ArithmeticConfig(num_test=500, max_operand=3), "leaves no training problems"),
        (ArithmeticConfig(max_operand=-1), ">= 0"),
    ],
)
def test_bad_data_config_is_refused(cfg, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        make_data(tmp_path, cfg)


def test_cli_writes_model_and_data(tmp_path):
    meshrl = [sys.executable, "-m", "cli"]
    subprocess.run(
        [*meshrl, "make-model", str(tmp_path / "m"), "--hidden-size", "64", "--num-layers", "1"],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [*meshrl, "make-data", str(tmp_path / "d"), "--num-train", "20", "--num-test", "5"],
        check=True,
        capture_output=True,
    )
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "m").config.hidden_size == 64
    assert len(pd.read_parquet(tmp_path / "d" / "test.parquet")) == 5


def test_meshrl_help_imports_neither_torch_nor_transformers():
    """`meshrl --help` took 7.8 s on a fresh clone, importing torch for two config dataclasses."""
    import subprocess
    import sys

    code = (
        "import sys; from cli.main import build_parser; build_parser().format_help(); "
        "print(sorted(m for m in ('torch', 'transformers', 'pandas') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_tool_share_mixes_traces_and_direct_answers_in_training_only(tmp_path):
    def answers(cfg, split):
        paths = make_data(tmp_path / f"{cfg.tool_share}", cfg)
        return [r["answer"] for r in pd.read_parquet(paths[split])["extra_info"]]

    mixed = ArithmeticConfig(ops="*", max_operand=99, tool=True, tool_share=0.5)
    traced = [a.startswith("<calc>") for a in answers(mixed, "train")]
    assert 0.45 < sum(traced) / len(traced) < 0.55
    assert all(a.startswith("<calc>") for a in answers(mixed, "test"))  # held out: the ground truth is what counts
    full = ArithmeticConfig(ops="*", max_operand=99, tool=True)
    assert all(a.startswith("<calc>") for a in answers(full, "train"))
    with pytest.raises(ValueError, match="tool_share must be in"):
        problems(ArithmeticConfig(tool_share=1.5))
