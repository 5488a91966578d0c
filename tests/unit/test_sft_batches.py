"""SFT batches (orchestrator.loops.sft): an answer row learns its answer and </s>; a conversation row (the
messages format) learns every assistant turn up to its end token and nothing else."""

import pandas as pd
import pytest
from transformers import AutoTokenizer

from meshrl.chat import turns
from orchestrator.data import PromptDataset
from orchestrator.loops.sft import sft_batch

TALK = [
    {"role": "system", "content": "add"},
    {"role": "user", "content": "1+2="},
    {"role": "assistant", "content": "3"},
    {"role": "user", "content": "2+2="},
    {"role": "assistant", "content": "4"},
]


@pytest.fixture(scope="module")
def tokenizer(tiny_lm):
    return AutoTokenizer.from_pretrained(tiny_lm)


def dataset(tmp_path, tokenizer, rows):
    pd.DataFrame(rows).to_parquet(tmp_path / "sft.parquet")
    return PromptDataset(str(tmp_path / "sft.parquet"), tokenizer, 256)


def test_a_conversation_learns_its_assistant_turns_only(tokenizer, tmp_path):
    answer_row = {"prompt": [{"role": "user", "content": "5+5="}], "extra_info": {"answer": "10"}}
    data = dataset(tmp_path, tokenizer, [{"prompt": TALK, "extra_info": {"answer": None}}, answer_row])
    batch = sft_batch(data, [0, 1])
    responses, mask = batch.batch["responses"], batch.batch["response_mask"]
    decode = lambda row, keep: tokenizer.decode(  # noqa: E731
        [t for t, m in zip(responses[row].tolist(), mask[row].tolist()) if m == keep and t != data.pad]
    )
    assert decode(0, 1) == "3</s>4</s>"  # each assistant turn with its end token
    assert decode(0, 0) == "\n<|user|>2+2=\n<|assistant|>\n"  # the turn between, the template's newline after
    prompt = tokenizer.decode([t for t in batch.batch["input_ids"][0].tolist()[: -responses.shape[1]] if t != data.pad])
    assert prompt == "<|system|>add\n<|user|>1+2=\n<|assistant|>"
    assert decode(1, 1) == "10</s>" and decode(1, 0) == ""  # the answer row, as before


def test_turns_refuse_a_conversation_without_an_assistant_or_a_row_without_an_answer(tokenizer, tmp_path):
    with pytest.raises(ValueError, match="no assistant turn to learn"):
        turns(tokenizer, TALK[:2], "row 0")
    data = dataset(tmp_path, tokenizer, [{"prompt": "1+1="}])
    with pytest.raises(ValueError, match="or a conversation with assistant turns; row 0 has neither"):
        sft_batch(data, [0])
