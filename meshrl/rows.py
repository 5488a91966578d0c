"""Rows of a data file, as every reader of one wants them: parquet (verl's own), JSON lines (.jsonl, or
.json holding a list of rows), or a HuggingFace `datasets` folder written by save_to_disk; and cell
values made plain (lists, dicts and Python scalars, None for an empty cell). The orchestrator's prompts
and a tiny BPE tokenizer's corpus (meshrl/tiny/bpe.py) both read through here.
"""

import pathlib

import numpy as np
import pandas as pd


def plain(value):
    """parquet gives numpy arrays and structs; the wire and the scorers want lists and dicts (and None where
    a row has no value)."""
    if isinstance(value, np.ndarray):
        return [plain(v) for v in value.tolist()]
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and value != value:  # NaN: pandas' empty cell in JSON rows that lack a key
        return None
    return value


FORMATS = ".parquet, .jsonl, .json, or a `datasets` folder (save_to_disk)"


def read_rows(path: pathlib.Path, key: str) -> pd.DataFrame:
    """One data file's rows, by its kind (FORMATS)."""
    if path.is_dir():
        import datasets  # only for folders: it takes a second to import

        try:
            data = datasets.load_from_disk(str(path))
        except FileNotFoundError as e:
            raise ValueError(f"{key}: {path} is a folder but not a `datasets` one ({e})") from None
        if isinstance(data, datasets.DatasetDict):
            raise ValueError(
                f"{key}: {path} holds the splits {sorted(data)}; name one of them, e.g. {path / next(iter(data))}"
            )
        return data.to_pandas()
    if path.suffix == ".parquet":
        return pd.read_parquet(path)
    if path.suffix in (".jsonl", ".json"):
        try:
            # values as written: "007" stays a string (pandas would make it the number 7), a "date" column text
            return pd.read_json(path, lines=path.suffix == ".jsonl", orient="records", dtype=False)
        except ValueError as e:
            raise ValueError(
                f"{key}: {path} is not JSON {'lines ' if path.suffix == '.jsonl' else ''}rows: {e}"
            ) from None
    raise ValueError(f"{key}: {path} is not a data file this reads ({FORMATS})")
