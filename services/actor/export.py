"""Export a saved actor checkpoint as a HuggingFace folder (and a peft adapter folder), offline.

A run writes checkpoints/step_N/actor/hf only at its last step. `meshrl export RUN_DIR` does the same
for any checkpoint, with no service running: one process joins a group of one, builds the engine the run
trained (its settings, on the plain engine), loads the checkpoint the way a resumed actor does (signed
folders only: services/actor/integrity.py) and writes what the run's own export writes (Engine.export_hf):
OUT/hf (a LoRA adapter merged in) and, where the actor trained one, OUT/hf_adapter.

The export is written outside the checkpoint: a signed folder that gained files would no longer load.
"""

import contextlib
import dataclasses
import json
import pathlib
import tempfile

import torch.distributed as dist

from meshrl.config.actor import EngineConfig, OptimConfig
from services.actor import integrity
from services.actor.engine import build_engine
from services.actor.servicer import STATE_FILE


def export(checkpoint: pathlib.Path, model: str, settings: dict, out: pathlib.Path) -> list[pathlib.Path]:
    """Write the actor checkpoint at `checkpoint` (a step's actor/ folder) to out/hf (and out/hf_adapter);
    `settings` are the actor's engine and optimizer settings as the run gave them (mesh.settings). The
    folders written; ValueError in one line for a folder that is not a signed actor checkpoint or that
    does not match the settings."""
    integrity.verify(checkpoint, integrity.checkpoint_key())  # before any torch code reads a file of it
    state = json.loads((checkpoint / STATE_FILE).read_text())
    if state.get("role", "actor") != "actor":
        raise ValueError(f"{checkpoint} is a {state['role']} checkpoint; export takes the actor's")
    saved_rank, rank = state.get("lora_rank", 0), settings.get("lora_rank", 0)
    if saved_rank != rank:
        raise ValueError(
            f"{checkpoint} holds an actor with lora_rank={saved_rank}, the run's config says actor.lora_rank={rank}"
        )
    engine_cfg = EngineConfig(**{k: settings[k] for k in _fields(EngineConfig)} | {"engine": "plain"})
    # the run's optimizer settings: a LoRA engine trains (it has an optimizer) and loads its state with it
    optim = OptimConfig(**{k: settings[k] for k in _fields(OptimConfig) if k in settings})

    with tempfile.TemporaryDirectory(prefix="meshrl-export-") as tmp, _group_of_one(pathlib.Path(tmp)):
        engine = build_engine(engine_cfg, model, "causal", optim)
        engine.load(checkpoint)
        out.mkdir(parents=True, exist_ok=True)
        adapter = out / "hf_adapter" if engine.lora else None
        engine.export_hf(out / "hf", adapter)
    return [out / "hf", *([adapter] if adapter else [])]


def _fields(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


@contextlib.contextmanager
def _group_of_one(folder: pathlib.Path):
    """A gloo process group of this process alone (the engines' collectives need one), destroyed after."""
    dist.init_process_group("gloo", init_method=f"file://{folder / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
