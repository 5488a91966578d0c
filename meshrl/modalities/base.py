"""What a modality is: the declarations one kind of model input beyond text makes (meshrl/modalities).

A modality's items (pictures; audio or video would be others) travel as encoded bytes in a non-tensor
column of the batch, a list per row, and every service that runs the model turns them into what its
forward takes with the model's own processor. A modality declares:

- `name`, `column`, `row_tensors`, `parts`: what errors call it, the batch column its items travel in, the
  per-row tensors the actor's forward reads (never cut with the sequence), and the chat content parts that
  hold it (data refuses the parts no modality claims);
- `read`: a data row's messages and items, from any shape users' data holds them in;
- `takes(config)`: whether a model (its config.json) reads it; `blind(config, prompts)`: refuse prompts
  holding its tokens in a batch without its items (the model would read the tokens' own embeddings);
- `reader(model, options)`: a `Reader` for that model folder, made once per service;
- `refuses(cfg, roles)`: what a run whose data holds it cannot do yet (one line, before the first step).
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence
from typing import Any, Protocol, TypeGuard

import torch


class MediaError(ValueError):
    """A row's item (a picture) that cannot be read, or that disagrees with its prompt; the message names the
    row. Services answer it as a bad request."""


class Reader(Protocol):
    """One model folder's processor for one modality: items' bytes in, what the model takes out."""

    def fit(self, items: list[bytes], ids: list[int], where: str) -> tuple[list[bytes], list[int]]:
        """Data's side: the row's items as the run keeps them (resized), and its ids with the modality's
        tokens expanded to what the processor makes of the items."""
        ...

    def batch(self, column: Sequence, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """The actor's side: the batch's row tensors (`row_tensors`), each row's prompt ids checked against
        its items."""
        ...

    def generate_inputs(self, prompts: list[list[int]], column: Sequence, n: int) -> dict[str, torch.Tensor]:
        """The hf rollout's side: what generate takes beside the ids, each prompt's repeated for its n
        samples."""
        ...

    def along(self, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """What generate takes that is read off the padded, repeated ids themselves."""
        ...


class Modality(Protocol):
    name: str
    column: str
    row_tensors: tuple[str, ...]
    parts: tuple[str, ...]

    def read(
        self, messages: list[dict], value: Any, where: str, base: pathlib.Path | None
    ) -> tuple[list[dict], list[bytes]]: ...

    def takes(self, config: dict) -> bool: ...

    def blind(self, config: dict, prompts: Sequence[Sequence[int]] | torch.Tensor) -> None: ...

    def reader(self, model: str, options: dict) -> Reader: ...

    def options(self, data: Any) -> dict: ...

    def refuses(self, cfg: Any, roles: set[str]) -> str: ...


def carries(column) -> TypeGuard[Sequence]:
    """Whether a batch column holds any item (a row's list may be empty or None)."""
    return column is not None and any(len(p or ()) for p in column)
