"""Model inputs beyond text, one module per modality, registered here once: data, the actor, the ref and the
hf rollout loop over MODALITIES and never name one.

- base: what a modality declares (`Modality`), the reader it makes per model folder (`Reader`), MediaError.
- vision: pictures (PICTURES), read from verl's, TRL's and OpenAI's data shapes and run through the Qwen2-VL
  family's image processor.

A second modality (audio, video) is one new module whose object meets `base.Modality`, and one entry in
MODALITIES; nothing else in the services changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from meshrl.modalities.base import MediaError, Modality, Reader, carries
from meshrl.modalities.vision import PICTURES

__all__ = ["COLUMNS", "MODALITIES", "PARTS", "ROW_TENSORS", "MediaError", "Readers", "carries", "check", "options"]

MODALITIES: tuple[Modality, ...] = (PICTURES,)
COLUMNS = tuple(m.column for m in MODALITIES)  # the batch's non-tensor columns of items
ROW_TENSORS = tuple(k for m in MODALITIES for k in m.row_tensors)  # per row, not per token
PARTS = frozenset(p for m in MODALITIES for p in m.parts)  # content parts some modality reads


def options(data: Any) -> dict[str, dict]:
    """Each modality's data settings (the data section: orchestrator.config.DataConfig), by its name."""
    return {m.name: m.options(data) for m in MODALITIES}


def check(cfg: Any, roles: set[str], sets: Sequence) -> None:
    """Data holding a modality meets what takes it, one line before the first step (sets: the datasets
    read, each with `key` and `rows`)."""
    for m in MODALITIES:
        keys = [d.key for d in sets if any(m.column in r for r in d.rows)]
        why = m.refuses(cfg, roles) if keys else ""
        if why:
            raise ValueError(f"{keys[0]} holds {m.name}: {why}")


class Readers:
    """A service's readers of one model folder (config: its config.json), one per modality, each made at
    its first items, or at start for the modalities the model takes when `eager` (a rollout that cannot
    read them should not start)."""

    def __init__(self, model: str, config: dict, settings: dict | None = None, eager: bool = False):
        self.model, self.config, self.settings = model, config, settings or {}
        self.made: dict[str, Reader] = {}
        for m in MODALITIES if eager else ():
            if m.takes(config):
                self.made[m.name] = m.reader(model, self.settings.get(m.name, {}))

    def get(self, m: Modality, where: str = "the batch") -> Reader:
        """The modality's reader; MediaError ("<where> has images, but ...") where the model reads none."""
        if m.name not in self.made:
            try:
                self.made[m.name] = m.reader(self.model, self.settings.get(m.name, {}))
            except MediaError:
                raise
            except ValueError as e:
                raise MediaError(f"{where} has {m.column}, but {e}") from None
        return self.made[m.name]

    def batch(self, columns: dict, ids: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """The row tensors of every modality the batch's columns carry (ids: the prompts' ids, checked
        against the items); prompts holding a modality's tokens without its items refused."""
        out: dict[str, torch.Tensor] = {}
        for m in MODALITIES:
            column = columns.get(m.column)
            if not carries(column):
                if ids is not None:
                    m.blind(self.config, ids)
                continue
            if ids is None:
                raise MediaError(f"the batch has {m.column} but no input_ids")
            out.update(self.get(m).batch(column, ids))
        return out

    def generate_inputs(self, prompts: list[list[int]], media: dict, n: int) -> tuple[dict, list[Reader]]:
        """What the hf rollout's generate takes beside the ids for the items in `media` (columns by name),
        and the readers that made them (their `along` runs on the padded ids)."""
        inputs: dict[str, torch.Tensor] = {}
        used = []
        for m in MODALITIES:
            column = media.get(m.column)
            if not carries(column):
                m.blind(self.config, prompts)
                continue
            reader = self.get(m)
            inputs.update(reader.generate_inputs(prompts, column, n))
            used.append(reader)
        return inputs, used
