"""Prompt data: verl parquet to left-padded batches; seeded, resumable order."""

import json

import pandas as pd
import pytest
import torch
from transformers import AutoTokenizer

from meshrl.chat import as_messages
from orchestrator.data import PromptDataset, Sampler


@pytest.fixture(scope="module")
def tokenizer(tiny_lm):
    return AutoTokenizer.from_pretrained(tiny_lm)


def test_dataset_renders_chat_prompts_and_keeps_columns(arithmetic_data, tokenizer):
    ds = PromptDataset(arithmetic_data["train"], tokenizer, max_prompt_length=64)
    assert len(ds) == 300 and ds.num_filtered == 0
    b = ds.batch([0, 1, 2], ["a", "b", "c"])
    row = ds.rows[0]
    text = tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
    ids = b.batch["input_ids"][0][b.batch["attention_mask"][0].bool()].tolist()
    assert tokenizer.decode(ids) == text and text.endswith("<|assistant|>")
    assert b.batch["attention_mask"][:, -1].all()  # left padded
    assert torch.equal(b.batch["position_ids"], (b.batch["attention_mask"].cumsum(1) - 1).clamp(min=0))
    assert b.non_tensor_batch["reward_model"][0] == row["reward_model"] and "ground_truth" in row["reward_model"]
    assert isinstance(b.non_tensor_batch["prompt"][0], list) and list(b.non_tensor_batch["uid"]) == ["a", "b", "c"]
    assert list(b.non_tensor_batch["data_source"]) == ["arithmetic"] * 3


def test_long_prompts_are_filtered_and_counted(arithmetic_data, tokenizer, tmp_path):
    frame = pd.read_parquet(arithmetic_data["test"])
    frame.loc[:9, "prompt"] = frame.loc[:9, "prompt"].apply(lambda p: [{"role": "user", "content": "1+" * 50 + "1="}])
    path = tmp_path / "long.parquet"
    frame.to_parquet(path)
    ds = PromptDataset(str(path), tokenizer, max_prompt_length=32)
    assert ds.num_filtered == 10 and len(ds) == len(frame) - 10
    # the error names the key and how long the prompts are, so the fix is obvious
    with pytest.raises(
        ValueError,
        match=r"data.train_files: no prompt fits 2 tokens \(data.max_prompt_length.*"
        r"prompts are 7-105 tokens",
    ):
        PromptDataset(str(path), tokenizer, max_prompt_length=2)
    with pytest.raises(ValueError, match="not found"):
        PromptDataset(str(tmp_path / "nope.parquet"), tokenizer, 32)


def test_sampler_is_seeded_covers_each_epoch_and_resumes():
    s = Sampler(10, 3, seed=1)
    epoch0 = [s.next() for _ in range(3)]
    rows = [r for batch, _ in epoch0 for r in batch]
    assert len(set(rows)) == 9  # three batches of an epoch, no repeats; the ragged tail is dropped
    rows4, uids4 = s.next()
    assert uids4[0] == "1-0" and s.state.epoch == 1
    assert Sampler(10, 3, seed=1).next() == epoch0[0]
    assert Sampler(10, 3, seed=2).next() != epoch0[0]
    # a resumed sampler continues exactly where the saved one was
    saved = s.state_dict()
    nxt = [s.next() for _ in range(5)]
    again = Sampler(10, 3, seed=1)
    again.load_state_dict(saved)
    assert [again.next() for _ in range(5)] == nxt
    with pytest.raises(ValueError, match=r"data.train_batch_size=11 must be in 1..10 \(the dataset's rows"):
        Sampler(10, 11, seed=0)


def test_string_prompts_are_one_user_message(arithmetic_data, tokenizer, tmp_path):
    """OpenRLHF/TRL-style text prompts (here under data.prompt_key's name) render as a user turn, exactly as
    the same prompt given as chat messages; the rows keep them as messages for the sample log."""
    frame = pd.read_parquet(arithmetic_data["test"]).head(4)
    frame["question"] = [p[-1]["content"] for p in frame["prompt"]]
    path = tmp_path / "text.parquet"
    frame.drop(columns=["prompt"]).to_parquet(path)
    as_text = PromptDataset(str(path), tokenizer, 64, prompt_key="question")
    as_chat = PromptDataset(arithmetic_data["test"], tokenizer, 64)
    assert as_text.prompt_ids == as_chat.prompt_ids[:4]
    assert as_text.rows[0]["prompt"] == [{"role": "user", "content": frame["question"][0]}]
    with pytest.raises(ValueError, match="column 'prompt' is missing .*data.prompt_key"):
        PromptDataset(str(path), tokenizer, 64)


@pytest.mark.parametrize(
    "bad,match",
    [
        ([{"role": None, "content": "1+1="}], r"message 0 must be a mapping with 'role'"),
        ([{"role": "robot", "content": "1+1="}], r"message 0 has role 'robot'"),
    ],
)
def test_a_prompt_the_template_cannot_take_names_its_row(arithmetic_data, tokenizer, tmp_path, bad, match):
    frame = pd.read_parquet(arithmetic_data["test"]).head(4)
    frame["prompt"] = [bad if i == 2 else list(p) for i, p in enumerate(frame["prompt"])]
    path = tmp_path / "bad.parquet"
    frame.to_parquet(path)
    with pytest.raises(ValueError, match=r"data.train_files row 2 \('prompt'\): " + match):
        PromptDataset(str(path), tokenizer, 64)


@pytest.mark.parametrize(
    "bad,match",
    [
        (7, "a prompt is a string or a non-empty list of chat messages"),
        ([], "a prompt is a string or a non-empty list"),
        ("", "the prompt is an empty string"),
        ([{"role": "user", "content": 5}], "message 0's content must be text"),
        (["1+1="], "message 0 must be a mapping"),
    ],
)
def test_as_messages_refuses_what_no_template_renders(bad, match):
    with pytest.raises(ValueError, match=r"^here: " + match):
        as_messages(bad, "here")
    assert as_messages("1+1=", "here") == [{"role": "user", "content": "1+1="}]


def test_jsonl_json_and_datasets_folders_give_the_rows_parquet_gives(arithmetic_data, tokenizer, tmp_path):
    import datasets

    frame = pd.read_parquet(arithmetic_data["train"]).head(12)
    frame.to_parquet(tmp_path / "rows.parquet")
    frame.to_json(tmp_path / "rows.jsonl", orient="records", lines=True)
    frame.to_json(tmp_path / "rows.json", orient="records")
    datasets.Dataset.from_pandas(frame, preserve_index=False).save_to_disk(str(tmp_path / "rows"))
    want = PromptDataset(str(tmp_path / "rows.parquet"), tokenizer, 128)
    for other in ("rows.jsonl", "rows.json", "rows"):
        got = PromptDataset(str(tmp_path / other), tokenizer, 128)
        assert got.prompt_ids == want.prompt_ids, other
        assert [r["reward_model"] for r in got.rows] == [r["reward_model"] for r in want.rows], other
        assert [r["prompt"] for r in got.rows] == [r["prompt"] for r in want.rows], other
    datasets.DatasetDict({"train": datasets.Dataset.from_pandas(frame)}).save_to_disk(str(tmp_path / "splits"))
    with pytest.raises(ValueError, match=r"holds the splits \['train'\]; name one of them"):
        PromptDataset(str(tmp_path / "splits"), tokenizer, 128)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="is a folder but not a `datasets` one"):
        PromptDataset(str(tmp_path / "empty"), tokenizer, 128)
    (tmp_path / "rows.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match=r"not a data file this reads \(.parquet, .jsonl"):
        PromptDataset(str(tmp_path / "rows.csv"), tokenizer, 128)
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    with pytest.raises(ValueError, match="bad.jsonl is not JSON lines rows"):
        PromptDataset(str(tmp_path / "bad.jsonl"), tokenizer, 128)


def test_json_rows_that_lack_a_column_others_have_read_as_none(arithmetic_data, tokenizer, tmp_path):
    """pandas fills the cells of a key only some JSON rows have with NaN; a row without `tools` or
    `extra_info` reads as one without them, not as a malformed value."""
    frame = pd.read_parquet(arithmetic_data["train"]).head(4)
    rows = frame.to_dict("records")
    rows[0]["tools"] = [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}]
    for r in rows[2:]:
        del r["extra_info"]
    # each line only its own keys, as hand-written JSON lines are
    lines = [json.dumps({k: v.tolist() if hasattr(v, "tolist") else v for k, v in r.items()}) for r in rows]
    (tmp_path / "mixed.jsonl").write_text("\n".join(lines) + "\n")
    ds = PromptDataset(str(tmp_path / "mixed.jsonl"), tokenizer, 128)
    assert len(ds) == 4 and "tools" in ds.rows[0] and all("tools" not in r for r in ds.rows[1:])
    assert ds.rows[1]["extra_info"] == rows[1]["extra_info"] and ds.rows[3]["extra_info"] is None


def test_a_datasets_folder_passes_the_run_s_input_check(arithmetic_data, tiny_lm, tmp_path):
    import datasets

    from orchestrator.config import load_config
    from orchestrator.data import check_inputs

    frame = pd.read_parquet(arithmetic_data["train"]).head(4)
    datasets.Dataset.from_pandas(frame, preserve_index=False).save_to_disk(str(tmp_path / "rows"))
    check_inputs(load_config(None, [f"actor.model={tiny_lm}", f"data.train_files={tmp_path / 'rows'}"]))
    with pytest.raises(ValueError, match="data file not found"):
        check_inputs(load_config(None, [f"actor.model={tiny_lm}", f"data.train_files={tmp_path / 'nothing'}"]))


def test_the_answer_column_and_a_system_prompt_are_as_the_data_section_says(tokenizer, tmp_path):
    """data.answer_key: OpenRLHF's label_key or TRL's `solution` column becomes the reward's ground truth
    and SFT's target, also dotted into a struct; data.system_prompt goes before prompts without one."""
    rows = [
        {"question": "1+2=", "solution": "3", "meta": {"label": "3"}},
        {"question": [{"role": "system", "content": "own"}, {"role": "user", "content": "2+2="}], "solution": "4"},
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    ds = PromptDataset(str(path), tokenizer, 128, prompt_key="question", answer_key="solution", system_prompt="Add.")
    assert [r["reward_model"]["ground_truth"] for r in ds.rows] == ["3", "4"]
    assert [r["extra_info"]["answer"] for r in ds.rows] == ["3", "4"]
    assert ds.rows[0]["prompt"][0] == {"role": "system", "content": "Add."}
    assert ds.rows[1]["prompt"][0] == {"role": "system", "content": "own"}  # its own stays, alone
    assert ds.batch([0], ["u"]).non_tensor_batch["reward_model"][0] == {"ground_truth": "3"}
    ds = PromptDataset(str(path), tokenizer, 128, prompt_key="question")
    assert "reward_model" not in ds.rows[0]  # unset: where verl keeps it, and these rows have none
    with pytest.raises(ValueError, match=r"row 1: no 'meta.label' \(data.answer_key"):
        PromptDataset(str(path), tokenizer, 128, prompt_key="question", answer_key="meta.label")
    # a prompt too long to sample is dropped before its other columns are read: no answer needed there
    rows.append({"question": "9+" * 200 + "9="})
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    ds = PromptDataset(str(path), tokenizer, 128, prompt_key="question", answer_key="solution")
    assert len(ds) == 2 and ds.num_filtered == 1


@pytest.mark.parametrize("name, text", [("empty.jsonl", ""), ("blank.jsonl", "\n"), ("empty.json", "[]")])
def test_an_empty_data_file_says_it_has_no_rows(tokenizer, tmp_path, name, text):
    """Not "column 'prompt' is missing ... columns: []" (an empty JSON file has no columns either)."""
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ValueError, match=rf"^data.train_files: {path} has no rows$"):
        PromptDataset(str(path), tokenizer, 64)


def test_an_empty_parquet_file_says_it_has_no_rows(arithmetic_data, tokenizer, tmp_path):
    """Not "no prompt fits 64 tokens": its columns are there, its rows are not."""
    path = tmp_path / "empty.parquet"
    pd.read_parquet(arithmetic_data["test"]).head(0).to_parquet(path)
    with pytest.raises(ValueError, match="has no rows"):
        PromptDataset(str(path), tokenizer, 64, key="data.val_files")


def test_pictures_need_a_vision_model_and_videos_are_refused_not_dropped(tiny_lm, tokenizer, tmp_path):
    """A text-only run would train on the text and lose the pictures without a word: it stops at the data
    with one line instead. Videos are not read yet: refused the same way. (Pictures themselves:
    tests/unit/test_vision.py.)"""
    path = tmp_path / "vl.jsonl"
    path.write_text(json.dumps({"prompt": "<image>How many?", "images": [{"bytes": None, "path": "a.png"}]}) + "\n")
    (tmp_path / "a.png").write_bytes(b"x")
    with pytest.raises(ValueError, match=r"row 0: the row has images, but .* is not a vision-language model") as e:
        PromptDataset(str(path), tokenizer, 64, model=str(tiny_lm))
    assert "\n" not in str(e.value)
    path.write_text(json.dumps({"prompt": "How many?", "videos": ["a.mp4"]}) + "\n")
    with pytest.raises(ValueError, match=r"column 'videos' holds videos, which meshrl does not train on"):
        PromptDataset(str(path), tokenizer, 64)
    part = {"type": "video_url", "video_url": {"url": "a.mp4"}}
    path.write_text(json.dumps({"prompt": [{"role": "user", "content": [part, {"type": "text", "text": "?"}]}]}))
    with pytest.raises(ValueError, match=r"row 0 \('prompt'\): message 0 has 'video_url' content"):
        PromptDataset(str(path), tokenizer, 64)
    # an images column with nothing in it (a mixed set filtered to its text rows) is text
    path.write_text("".join(json.dumps({"prompt": f"{a}+1=", "images": []}) + "\n" for a in range(3)))
    assert len(PromptDataset(str(path), tokenizer, 64)) == 3
