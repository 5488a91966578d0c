"""A second modality is one module and one registration (meshrl/modalities): a toy one ("tones", a made-up
audio-like input: each item's bytes become that many tone tokens and one row tensor) registered beside the
pictures reaches data, the actor's batch, the rollout's request reading and the run's refusals, with no
service naming it."""

import dataclasses

import pandas as pd
import pytest
import torch
from transformers import AutoTokenizer

from meshrl import modalities
from meshrl.chat import render
from meshrl.dataproto import DataProto
from meshrl.errors import InvalidArgument
from meshrl.modalities.base import MediaError
from meshrl.tiny.models import TinyModelConfig, make_model
from orchestrator.config import load_config
from orchestrator.data import PromptDataset
from services.rollout import layout

MARK = "<tone>"


@dataclasses.dataclass
class ToneReader:
    token: int

    def fit(self, items, ids, where):
        """The first tone token becomes one per byte of the first tone; tones are kept cut to 2 bytes."""
        first = ids.index(self.token)
        return [t[:2] for t in items], [*ids[:first], *[self.token] * len(items[0]), *ids[first + 1 :]]

    def batch(self, column, ids):
        return {"tone_values": torch.tensor([[len(b) for b in row or ()] or [0] for row in column])}

    def generate_inputs(self, prompts, column, n):
        return {"tone_values": torch.tensor([len(row) for row in column for _ in range(n)])}

    def along(self, ids):
        return {"tone_mask": (ids == self.token).int()}


class Tones:
    name, column = "tones", "tones"
    row_tensors: tuple[str, ...] = ("tone_values",)
    parts: tuple[str, ...] = ("input_audio",)

    def read(self, messages, value, where, base):
        items = list(value or [])
        marks = sum(str(m.get("content", "")).count(MARK) for m in messages)
        if marks != len(items):
            raise MediaError(f"{where}: {marks} tone place(s) for {len(items)} tone(s)")
        return messages, items

    def takes(self, config):
        return bool(config.get("tones"))

    def blind(self, config, prompts):
        if self.takes(config) and any(config["tones"] in list(p) for p in prompts):
            raise MediaError("a prompt holds tone tokens but the batch carries no tones")

    def reader(self, model, options):
        return ToneReader(options.get("token", 5))

    def options(self, data):
        return {}

    def refuses(self, cfg, roles):
        return "set rollout.backend=hf" if "rollout" in roles and cfg.rollout.backend != "hf" else ""


@pytest.fixture
def tones(monkeypatch):
    """Tones registered as a line in MODALITIES would be, the names derived from it with it."""
    monkeypatch.setattr(modalities, "MODALITIES", (*modalities.MODALITIES, Tones()))
    monkeypatch.setattr(modalities, "COLUMNS", (*modalities.COLUMNS, Tones.column))
    monkeypatch.setattr(modalities, "ROW_TENSORS", (*modalities.ROW_TENSORS, *Tones.row_tensors))


def test_data_reads_a_registered_modality_and_expands_its_tokens(tones, tmp_path):
    folder = make_model(tmp_path / "m", TinyModelConfig())
    tokenizer = AutoTokenizer.from_pretrained(folder)
    token = tokenizer(MARK, add_special_tokens=False)["input_ids"]
    rows = [{"prompt": f"hear {MARK} ?", "tones": [b"abc"]}, {"prompt": "plain"}]
    pd.DataFrame(rows).to_parquet(tmp_path / "d.parquet")
    data = PromptDataset(
        str(tmp_path / "d.parquet"), tokenizer, 100, model=str(folder), media={"tones": {"token": token[0]}}
    )
    assert data.rows[0]["tones"] == [b"ab"] and "tones" not in data.rows[1]
    plain = tokenizer(
        render(tokenizer, [{"role": "user", "content": rows[0]["prompt"]}], "w"), add_special_tokens=False
    )
    first = plain["input_ids"].index(token[0])
    assert data.prompt_ids[0] == [*plain["input_ids"][:first], *[token[0]] * 3, *plain["input_ids"][first + 1 :]]
    assert list(data.batch([0, 1], ["a", "b"]).non_tensor_batch["tones"]) == [[b"ab"], None]
    pd.DataFrame([{"prompt": "no mark", "tones": [b"a"]}]).to_parquet(tmp_path / "bad.parquet")
    with pytest.raises(MediaError, match="0 tone place"):
        PromptDataset(str(tmp_path / "bad.parquet"), tokenizer, 100, model=str(folder))


def test_services_read_a_registered_modality_without_naming_it(tones):
    readers = modalities.Readers("m", {"tones": 5})
    ids = torch.tensor([[1, 5, 2], [3, 4, 2]])
    assert readers.batch({"tones": [[b"ab"], []]}, ids)["tone_values"].tolist() == [[2], [0]]
    with pytest.raises(MediaError, match="carries no tones"):
        readers.batch({}, ids)
    inputs, used = readers.generate_inputs([[1, 5], [3]], {"tones": [[b"a"], [b"b", b"c"]]}, 2)
    assert inputs["tone_values"].tolist() == [1, 1, 2, 2] and used[0].along(ids)["tone_mask"][0].tolist() == [0, 1, 0]
    data = DataProto(non_tensor_batch={"tones": [[b"ab"], []]})
    hf, vllm = type("B", (), {"name": "hf", "takes": ("tones",)}), type("B", (), {"name": "vllm", "takes": ()})
    assert layout.read_media(data, hf) == {"media": {"tones": [[b"ab"], []]}}
    with pytest.raises(InvalidArgument, match="the batch has tones, which the vllm rollout backend does not take"):
        layout.read_media(data, vllm)


def test_a_run_is_refused_where_a_registered_modality_cannot_go(tones):
    sets = [type("D", (), {"key": "data.val_files", "rows": [{"prompt": [], "tones": [b"a"]}]})]
    with pytest.raises(ValueError, match="data.val_files holds tones: set rollout.backend=hf"):
        modalities.check(load_config(None, ["rollout.backend=vllm"]), {"actor", "rollout"}, sets)
    modalities.check(load_config(None, ["rollout.backend=hf"]), {"actor", "rollout"}, sets)
