"""Prompts for the algorithm loops: verl-schema rows in, left-padded DataProto batches out.

Rows come from parquet (verl's own), JSON lines (.jsonl, or .json holding a list of rows, as OpenRLHF and
TRL data often are), or a HuggingFace `datasets` folder written by save_to_disk (read with `datasets`;
a DatasetDict's folder names its splits, and one of them is the file to give).

Each row's prompt (the `prompt` column, or the one data.prompt_key names: chat
messages, or a plain string, which is one user message) is rendered with the
tokenizer's chat template; anything else stops the run naming the row; rows
whose prompt exceeds max_prompt_length tokens are dropped and counted. The
sampler walks the rows in a seeded order, epoch after epoch, and its position
is part of a checkpoint, so a resumed run sees the same batches. With a reward
function of TRL's form each row also carries its other dataset columns as they
are (`dataset_columns`, the prompt under "prompt"): TRL passes them to the
function by name, and the reward service does too. An episode's task is read from its row here too
(task_of, agent_task).
"""

import dataclasses
import json
import logging
import pathlib

import pandas as pd
import torch

from meshrl import modalities, seeds
from meshrl.chat import as_messages, as_tools, render
from meshrl.dataproto import DataProto
from meshrl.layout import prompt_tensors
from meshrl.reward_forms import trl_form
from meshrl.rows import plain, read_rows
from orchestrator.config import save_config

log = logging.getLogger(__name__)

COLUMNS = ("data_source", "reward_model", "extra_info", "ability")
KEPT = (*COLUMNS, "tools")  # what a row keeps by name; dataset_columns holds the others


def dig(record: dict, dotted: str, where: str):
    """record's value at a dotted path (`extra_info.answer`: a column, then a key of its struct)."""
    value: object = record
    for part in dotted.split("."):
        value = plain(value)
        if not isinstance(value, dict) or value.get(part) is None:
            raise ValueError(f"{where}: no {dotted!r} (data.answer_key names the answer's column)")
        value = value[part]
    return plain(value)


MEDIA_COLUMNS = ("videos",)  # verl's and TRL's video column: refused where it holds any, not dropped
MEDIA = {"image", "image_url", "input_image", "video", "video_url", "audio", "input_audio", "file"}  # content parts
MEDIA_PARTS = MEDIA - modalities.PARTS  # refused: the media no modality reads (meshrl/modalities)


def holds(cell) -> bool:
    """A cell with something in it (not None, NaN or an empty list, string or mapping)."""
    value = plain(cell)  # NaN, pandas' empty cell, is None here
    return not (value is None or (isinstance(value, (list, str, dict)) and not value))


def media_kind(part: dict) -> str:
    """A content part's media kind ("" for text and the rest): its type, or an untyped part's image key."""
    kind = part.get("type")
    if kind is None:
        kind = next((k for k in ("video", "video_url", "input_audio") if k in part), "")
    return str(kind) if kind in MEDIA_PARTS else ""


class PromptDataset:
    def __init__(  # noqa: PLR0913 - the data section's keys, passed by name
        self,
        files: str | list[str],
        tokenizer,
        max_prompt_length: int,
        *,
        prompt_key: str = "prompt",
        key: str = "data.train_files",
        answer_key: str = "",
        system_prompt: str = "",
        dataset_columns: bool = False,
        model: str = "",
        media: dict[str, dict] | None = None,
    ):
        """dataset_columns: each row also keeps its dataset columns as they are (the prompt under "prompt",
        as a TRL-form reward function is passed them), as `dataset_columns`. model: the policy's folder, whose
        image processor says how many image tokens a row's pictures take (rows with pictures need a
        vision-language model); media: each modality's data settings by name (meshrl/modalities.options: the
        column that holds pictures, data.image_key, and what they are resized to, data.min_pixels/max_pixels)."""
        self.key, self.prompt_key, self.answer_key = key, prompt_key, answer_key
        self.system_prompt, self.dataset_columns = system_prompt, dataset_columns
        self.model, self.media = model, media or {}
        self.readers = modalities.Readers(model, {}, self.media)  # each made for the first row with its items
        self.bases: list[pathlib.Path] = []  # each row's file's folder: its relative image paths are from there
        frame = self.read(files)
        self.rows, self.prompt_ids = [], []
        lengths = []
        for number, record in enumerate(frame.to_dict("records")):
            row, ids = self.row(record, number, tokenizer, max_prompt_length)
            lengths.append(len(ids))
            if row is not None:
                self.rows.append(row)
                self.prompt_ids.append(ids)
        self.num_filtered = len(lengths) - len(self.rows)
        self.report(lengths, max_prompt_length)
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.tokenizer = tokenizer

    def read(self, files: str | list[str]) -> pd.DataFrame:
        """The files' rows, one frame; refused (one line) when a file is missing, empty or lacks the prompts."""
        paths = [files] if isinstance(files, (str, pathlib.Path)) else list(files)
        missing = [str(p) for p in paths if not pathlib.Path(p).exists()]
        if missing:
            raise ValueError(f"data file(s) not found: {missing}")
        key = self.key
        frames = [read_rows(pathlib.Path(p), key) for p in paths]
        self.bases = [pathlib.Path(p).parent for p, f in zip(paths, frames) for _ in range(len(f))]
        frame = pd.concat(frames, ignore_index=True)
        if len(frame) == 0:  # before the columns: an empty JSON lines file has none
            raise ValueError(f"{key}: {', '.join(map(str, paths))} {'has' if len(paths) == 1 else 'have'} no rows")
        if self.prompt_key not in frame.columns:
            raise ValueError(
                f"{key}: column {self.prompt_key!r} is missing from {paths} (data.prompt_key names the "
                f"prompt column); columns: {list(frame.columns)}"
            )
        media = [c for c in MEDIA_COLUMNS if c in frame.columns and any(map(holds, frame[c]))]
        if media:
            raise ValueError(
                f"{key}: column {media[0]!r} holds videos, which meshrl does not train on yet (it trains on text "
                "and pictures): drop the column"
            )
        return frame

    def row(self, record: dict, number: int, tokenizer, max_length: int) -> tuple[dict | None, list[int]]:
        """One record as the sampler's row (verl's columns, the prompt as messages) and its prompt's ids; no
        row for a prompt over max_length tokens (dropped before its other columns are read)."""
        key, prompt_key = self.key, self.prompt_key
        where = f"{key} row {number} ({prompt_key!r})"
        messages = as_messages(plain(record[prompt_key]), where)
        for i, m in enumerate(messages):
            content = m.get("content")
            kinds = sorted({media_kind(p) for p in content or () if isinstance(p, dict)} - {""})
            if kinds:
                raise ValueError(
                    f"{where}: message {i} has {kinds[0]!r} content, which meshrl does not train on yet "
                    "(it trains on text and pictures)"
                )
        items = {}
        for kind in modalities.MODALITIES:
            column = plain(record.get(self.media.get(kind.name, {}).get("key", kind.column)))
            messages, items[kind] = kind.read(messages, column, f"{key} row {number}", self.bases[number])
        if self.system_prompt and messages[0]["role"] != "system":
            messages = [{"role": "system", "content": self.system_prompt}, *messages]
        tools = as_tools(plain(record.get("tools")), f"{key} row {number} ('tools')")
        ids = tokenizer(render(tokenizer, messages, where, tools), add_special_tokens=False)["input_ids"]
        for kind, got in items.items():
            if got:
                items[kind], ids = self.fit(kind, got, ids, f"{key} row {number}")
        if len(ids) > max_length:
            return None, ids
        row = {"prompt": messages, **{k: plain(record[k]) for k in COLUMNS if k in record}}
        row.update({kind.column: got for kind, got in items.items() if got})
        if self.answer_key:  # the reward's ground truth and SFT's target, where verl keeps them
            answer = dig(record, self.answer_key, f"{key} row {number}")
            row["reward_model"] = {**(row.get("reward_model") or {}), "ground_truth": answer}
            row["extra_info"] = {**(row.get("extra_info") or {}), "answer": answer}
        if self.dataset_columns:
            row["dataset_columns"] = {
                "prompt" if k == prompt_key else k: plain(v) for k, v in record.items() if k not in KEPT
            }
        return ({**row, "tools": tools} if tools else row), ids

    def fit(self, m, items: list[bytes], ids: list[int], where: str) -> tuple[list[bytes], list[int]]:
        """The row's items as the run keeps them (pictures at the size data.min_pixels/max_pixels allow), and
        its ids with the modality's tokens expanded as the model's processor makes them."""
        if not self.model:
            raise ValueError(f"{where}: the row has {m.column}; reading them needs the policy's model (actor.model)")
        try:
            return self.readers.get(m, f"{where}: the row").fit(items, ids, where)
        except modalities.MediaError as e:
            raise ValueError(str(e)) from None

    def report(self, lengths: list[int], max_prompt_length: int) -> None:
        """Refuse a dataset none of whose prompts fit; say how many were dropped."""
        spread = (
            f"prompts are {min(lengths, default=0)}-{max(lengths, default=0)} tokens with the chat template, "
            f"median {sorted(lengths)[len(lengths) // 2] if lengths else 0}"
        )
        if not self.rows:
            raise ValueError(
                f"{self.key}: no prompt fits {max_prompt_length} tokens (data.max_prompt_length, or "
                f"rollout.max_model_len - rollout.max_new_tokens): {spread}"
            )
        if self.num_filtered:
            (log.warning if self.num_filtered > len(lengths) // 10 else log.info)(
                "%s: dropped %d of %d prompts longer than %d tokens (%s)",
                self.key,
                self.num_filtered,
                len(lengths),
                max_prompt_length,
                spread,
            )

    def __len__(self) -> int:
        return len(self.rows)

    def batch(self, indices: list[int], uids: list[str]) -> DataProto:
        """input_ids (left padded), attention_mask, position_ids, and the rows' columns plus a uid each."""
        columns = {
            k: [self.rows[i].get(k) for i in indices]
            for k in ("prompt", *COLUMNS, "tools", "dataset_columns", *modalities.COLUMNS)
            if any(k in self.rows[i] for i in indices)
        }
        columns["uid"] = list(uids)
        return DataProto(prompt_tensors([self.prompt_ids[i] for i in indices], self.pad), columns)


@dataclasses.dataclass
class SamplerState:
    epoch: int = 0
    position: int = 0  # rows of this epoch's order already served


class Sampler:
    """Batches of row indices in a seeded order per epoch; drops the ragged tail of an epoch."""

    def __init__(
        self, num_rows: int, batch_size: int, seed: int, shuffle: bool = True, key: str = "data.train_batch_size"
    ):
        if batch_size < 1 or batch_size > num_rows:
            raise ValueError(
                f"{key}={batch_size} must be in 1..{num_rows} (the dataset's rows, less those whose prompt is too long)"
            )
        self.num_rows, self.batch_size, self.seed, self.shuffle = num_rows, batch_size, seed, shuffle
        self.state = SamplerState()

    def order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(self.num_rows))
        g = torch.Generator().manual_seed(self.seed * seeds.EPOCH + epoch)
        return torch.randperm(self.num_rows, generator=g).tolist()

    def next(self) -> tuple[list[int], list[str]]:
        """(row indices, uids) of the next batch; uids are unique across the whole run."""
        if self.state.position + self.batch_size > self.num_rows:
            self.state = SamplerState(self.state.epoch + 1, 0)
        start = self.state.position
        rows = self.order(self.state.epoch)[start : start + self.batch_size]
        uids = [f"{self.state.epoch}-{start + i}" for i in range(len(rows))]
        self.state.position += self.batch_size
        return rows, uids

    def state_dict(self) -> dict:
        return dataclasses.asdict(self.state)

    def load_state_dict(self, state: dict) -> None:
        self.state = SamplerState(**state)


def dataset(cfg, files: str, tokenizer) -> PromptDataset:
    """The rows data.train_files or data.val_files names, read as the data section says."""
    d = cfg.data
    key = f"data.{files}"
    return PromptDataset(
        getattr(d, files),
        tokenizer,
        prompt_limit(cfg),
        prompt_key=d.prompt_key,
        key=key,
        answer_key=d.answer_key,
        system_prompt=d.system_prompt,
        dataset_columns=trl_form(cfg.reward.function),
        model=cfg.actor.model,
        media=modalities.options(d),
    )


def prompt_limit(cfg) -> int:
    """Prompt tokens kept: data.max_prompt_length, or (0) what leaves room for the response in the engine."""
    return cfg.data.max_prompt_length or cfg.rollout.max_model_len - cfg.rollout.max_new_tokens


def check_inputs(cfg) -> None:
    """The model folder and data files the config names exist (checked before any service starts)."""
    if not cfg.actor.model or not cfg.data.train_files:
        raise ValueError("set actor.model and data.train_files")
    if not (pathlib.Path(cfg.actor.model) / "config.json").is_file():
        raise ValueError(f"actor.model={cfg.actor.model} is not a HuggingFace model folder (no config.json there)")
    for key in ("train_files", "val_files"):
        path = getattr(cfg.data, key)
        if path and not pathlib.Path(path).exists():  # a file, or a `datasets` folder (read_rows tells them apart)
            raise ValueError(f"data.{key}={path}: data file not found")


def prepare_run(cfg) -> tuple[pathlib.Path, object, PromptDataset, Sampler]:
    """What every loop starts with (after preflight.check, which checked the inputs exist): the run
    folder (with the resolved config saved in it), the tokenizer, the training prompts and their sampler."""
    from transformers import AutoTokenizer

    run_dir = pathlib.Path(cfg.trainer.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run_dir / "config.yaml")
    tokenizer = AutoTokenizer.from_pretrained(cfg.actor.model)
    data = dataset(cfg, "train_files", tokenizer)
    return run_dir, tokenizer, data, Sampler(len(data), cfg.data.train_batch_size, cfg.trainer.seed, cfg.data.shuffle)


# ---- what an episode is given from its row (multi-turn and agent episodes) -----------------------------


def cell(columns: dict, name: str, row: int):
    return columns[name][row] if name in columns else None


def task_of(columns: dict, row: int) -> dict:
    """The episode's task from the row's verl columns."""
    rm = cell(columns, "reward_model", row)
    return {
        "data_source": cell(columns, "data_source", row) or "",
        "ground_truth": rm.get("ground_truth") if isinstance(rm, dict) else None,
        "extra_info": cell(columns, "extra_info", row),
    }


def jsonable(value):
    return value.tolist() if hasattr(value, "tolist") else str(value)


def agent_task(columns: dict, row: int) -> dict:
    """What the agent is given: the row's prompt as chat messages, its tools, and its verl columns."""
    prompt = cell(columns, "prompt", row)
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    task = {
        **task_of(columns, row),
        "prompt": messages,
        "tools": as_tools(cell(columns, "tools", row), f"row {row}"),
    }
    return json.loads(json.dumps(task, default=jsonable))  # parquet's arrays as lists
