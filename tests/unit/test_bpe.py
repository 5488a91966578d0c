"""The byte-level BPE tokenizer and ChatML template (meshrl/tiny/bpe.py) on every supported family: what
AutoTokenizer loads encodes as the trained tokenizer does, digits are single tokens, two end tokens,
tool tags survive decoding, and the template's tool turns are what SFT trains and a multi-turn run
appends."""

import json

import pytest
import torch
from tokenizers import Tokenizer
from transformers import AutoConfig, AutoTokenizer

from meshrl.chat import after_turn, turns
from meshrl.models import causal_class, end_ids
from meshrl.tiny.arithmetic import CALCULATOR, ArithmeticConfig, conversation, make_data
from meshrl.tiny.models import FAMILIES, TinyModelConfig, make_model
from meshrl.tool_calls import hermes

SMALL = {"hidden_size": 32, "intermediate_size": 64, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1}


@pytest.fixture(scope="module")
def bpe_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("bpe")
    return {f: make_model(root / f, TinyModelConfig(family=f, tokenizer="bpe", **SMALL)) for f in FAMILIES}


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_loads_generates_and_encodes_as_trained(bpe_models, family):
    path = bpe_models[family]
    model = causal_class(AutoConfig.from_pretrained(path)).from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    raw = Tokenizer.from_file(str(path / "tokenizer.json"))  # what was trained, whatever class Auto picks
    text = tok.apply_chat_template(conversation("12*7=", "12*7", "84", True), tools=[CALCULATOR], tokenize=False)
    assert tok(text, add_special_tokens=False)["input_ids"] == raw.encode(text, add_special_tokens=False).ids
    assert model.config.model_type == family and len(tok) <= model.config.get_text_config().vocab_size
    assert sorted(end_ids(tok, model.generation_config)) == sorted(
        tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    )
    out = model.generate(torch.tensor([tok(text)["input_ids"]]), max_new_tokens=4, do_sample=False)
    assert out.shape[1] >= len(tok(text)["input_ids"]) + 1


def test_digits_are_single_tokens_and_tool_tags_survive_decoding(bpe_models):
    tok = AutoTokenizer.from_pretrained(bpe_models["qwen2"])
    ids = tok("1234*98=120932", add_special_tokens=False)["input_ids"]
    assert len(ids) == 14 and tok.decode(ids) == "1234*98=120932"
    text = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}}\n</tool_call><|im_end|>'
    decoded = tok.decode(tok(text, add_special_tokens=False)["input_ids"], skip_special_tokens=True)
    assert decoded == text.removesuffix("<|im_end|>")  # the tags stay for the parser; the end token goes
    assert [(c.name, c.arguments) for c in hermes(decoded)] == [("calculator", {"expression": "1+1"})]


def test_training_is_deterministic(tmp_path):
    a = make_model(tmp_path / "a", TinyModelConfig(tokenizer="bpe", family="qwen2", **SMALL))
    b = make_model(tmp_path / "b", TinyModelConfig(tokenizer="bpe", family="qwen2", **SMALL))
    assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()


def test_a_tool_turn_is_trained_as_sampled_and_the_results_are_what_a_run_appends(bpe_models):
    """SFT's pieces of a tool conversation: the assistant turns up to and with <|im_end|> trained, the
    template's text between them not; that text is exactly what a multi-turn run appends after the turn."""
    tok = AutoTokenizer.from_pretrained(bpe_models["qwen2"])
    pieces = turns(tok, conversation("12*7=", "12*7", "84", True), "row 0", [CALCULATOR])
    assert [trained for _, trained in pieces] == [False, True, False, True, False]
    assert pieces[0][0].startswith("<|im_start|>system\n") and '"calculator"' in pieces[0][0]
    assert (
        pieces[1][0]
        == '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*7"}}\n</tool_call><|im_end|>'
    )
    assert pieces[2][0] == after_turn(tok, [{"role": "tool", "content": "84"}], [CALCULATOR])
    assert (
        pieces[2][0] == "\n<|im_start|>user\n<tool_response>\n84\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert pieces[3][0] == "84<|im_end|>"
    two = after_turn(tok, [{"role": "tool", "content": "1"}, {"role": "tool", "content": "2"}])
    assert two.count("<tool_response>") == 2 and two.count("<|im_start|>user") == 1  # one user turn


def test_hermes_tool_task_data(tmp_path):
    paths = make_data(
        tmp_path, ArithmeticConfig(ops="*", num_train=40, num_test=10, tool=True, tool_share=0.5, tool_format="hermes")
    )
    import pandas as pd

    train, test = pd.read_parquet(paths["train"]), pd.read_parquet(paths["test"])
    assert "messages" in train and "tools" in train and "messages" not in test
    assert json.loads(train["tools"][0]) == [CALCULATOR]
    lengths = {len(m) for m in train["messages"]}
    assert lengths == {2, 4}  # direct answers and calculator traces
    with pytest.raises(ValueError, match="tool_format"):
        make_data(tmp_path / "x", ArithmeticConfig(tool=True, tool_format="xml"))


def test_a_tokenizer_trained_on_a_tasks_own_file_merges_its_words(tmp_path):
    """make-model --bpe-corpus FILE: the file's text (prompts' messages, answers) trains the BPE too, so the
    task's own words take few tokens, where the arithmetic corpus alone spells them out."""
    rows = [{"prompt": [{"role": "user", "content": "photosynthesis converts sunlight"}], "answer": "chlorophyll"}]
    (tmp_path / "task.jsonl").write_text("\n".join(json.dumps(r) for r in rows * 200) + "\n")
    plain = make_model(tmp_path / "plain", TinyModelConfig(family="qwen2", tokenizer="bpe", **SMALL))
    own = make_model(
        tmp_path / "own",
        TinyModelConfig(family="qwen2", tokenizer="bpe", bpe_corpus=str(tmp_path / "task.jsonl"), **SMALL),
    )
    words = " photosynthesis chlorophyll"
    a, b = (AutoTokenizer.from_pretrained(m)(words, add_special_tokens=False)["input_ids"] for m in (plain, own))
    assert 2 * len(b) < len(a), (len(a), len(b))  # 6 against 23 here
    assert AutoTokenizer.from_pretrained(own).decode(b) == words
    with pytest.raises(ValueError, match="task.csv is not a data file this reads"):
        make_model(tmp_path / "bad", TinyModelConfig(tokenizer="bpe", bpe_corpus=str(tmp_path / "task.csv")))


def test_the_end_tokens_of_a_folder_without_a_generation_config_come_from_its_config(bpe_models, tmp_path):
    """What transformers and vLLM read when a model folder has no generation_config.json: config.json's
    eos_token_id, both end tokens here (a multi-turn episode ends its turns at the same ones)."""
    import shutil

    from meshrl.models import generation_config

    folder = shutil.copytree(bpe_models["qwen2"], tmp_path / "no-gen")
    (folder / "generation_config.json").unlink()
    tok = AutoTokenizer.from_pretrained(folder)
    want = sorted(tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>"))
    assert sorted(end_ids(tok, generation_config(str(folder)))) == want
    assert sorted(end_ids(tok, generation_config(str(bpe_models["qwen2"])))) == want
    assert generation_config(str(tmp_path / "nothing")) is None and generation_config("") is None
