"""A run's checkpoints: what save writes (each trained service's own checkpoint and orchestrator.json),
what resume restores, and the run folder's link to the final model.

checkpoints/step_N/ holds actor/, critic/ (the services write them, DCP, each signed
with an integrity.json the service checks before loading: services/actor/integrity.py)
and orchestrator.json (step, data position, RNG state, the algorithm's own state, and with
rollout.partial the samples carried into the next step, their tokens in partial.safetensors);
checkpoints/latest names the newest complete one. A step is written under step_N.partial/ and renamed
when whole, so a save cut short (a full disk, a lost service, Ctrl-C) leaves no step_N/ that looks
complete; a full disk is said in one line with the last good checkpoint.
"""

import errno
import json
import logging
import os
import pathlib
import shutil

import torch
from safetensors.torch import load_file, save_file

from meshrl import disk
from orchestrator.lifecycle.mesh import Mesh
from orchestrator.loops.algorithm import Algorithm
from orchestrator.sampling.partial import Partial

log = logging.getLogger(__name__)
CARRY_FILE = "partial.safetensors"  # rollout.partial: the carried samples' tokens, log-probs and versions


class DiskFull(OSError):
    """A checkpoint could not be written for want of space; says where and which checkpoint is good."""


def save(
    run_dir: pathlib.Path,
    number: int,
    mesh: Mesh,
    algorithm: Algorithm,
    *,
    sampler_state: dict,
    last: bool,
    carry: Partial | None = None,
) -> pathlib.Path:
    """Step `number`'s checkpoint: the trained services' own, and orchestrator.json (`sampler_state`: the
    data position after the step's batch; `carry`: the partial rollouts' after the step, its samples' tokens
    in partial.safetensors); `last` also exports the actor as HF. DiskFull when the disk is; what was
    written of the step is removed in any failure."""
    path = run_dir / "checkpoints" / f"step_{number}"
    partial = path.with_name(f"{path.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)  # left by a run killed mid-save
    try:
        for role in algorithm.trained:
            mesh.save(role, partial / role, export_hf=last and role == "actor")
        state = {
            "step": number,
            "sampler": sampler_state,
            "algorithm": algorithm.state_dict(),
            "torch_rng": torch.get_rng_state().tolist(),
        }
        if carry is not None:
            kept = carry.state_dict()
            save_file(kept.pop("tensors"), str(partial / CARRY_FILE))
            state["partial"] = kept
        (partial / "orchestrator.json").write_text(json.dumps(state))
        if path.exists():  # a step redone after a recovery replaces the one saved before
            shutil.rmtree(path)
        os.replace(partial, path)
        (run_dir / "checkpoints" / "latest").write_text(path.name)  # last: a half-saved step is not "latest"
    except BaseException as e:
        full = full_disk(path.parent, e)  # before the partial folder goes: the space free when the save failed
        shutil.rmtree(partial, ignore_errors=True)
        if full is not None:
            latest = run_dir / "checkpoints" / "latest"
            good = latest.read_text().strip() if latest.is_file() else "none yet"
            raise DiskFull(errno.ENOSPC, f"cannot save step {number}: {full}; the last whole checkpoint: {good}") from e
        raise
    return path


def full_disk(folder: pathlib.Path, e: BaseException) -> str | None:
    """The line saying which disk is full: the service's own where it said it (of its disk, as it sees the
    folder), else from this process's error and view of `folder` (meshrl.disk); None for another failure."""
    text = str(e)
    if disk.SAID in text:
        return text[text.index(disk.SAID) :]
    return disk.full_disk(folder, e)


def resume(run_dir: pathlib.Path, mesh: Mesh, algorithm: Algorithm, sampler, partial: Partial | None = None) -> int:
    """Restore the latest checkpoint into the services, the sampler, the algorithm and the partial rollouts'
    carry; its step (0: none)."""
    latest = run_dir / "checkpoints" / "latest"
    if not latest.is_file():
        log.info("no checkpoint in %s: starting from step 1", run_dir)
        return 0
    path = run_dir / "checkpoints" / latest.read_text().strip()
    state = json.loads((path / "orchestrator.json").read_text())
    if partial is not None and "partial" not in state:
        raise ValueError(
            f"{path} was saved without rollout.partial, so it holds no carried samples: resume it with "
            "rollout.partial=false"
        )
    if partial is None and state.get("partial", {}).get("groups"):
        log.warning(
            "%s carries %d groups of partial rollouts, which this run (rollout.partial=false) leaves unfinished",
            path,
            len(state["partial"]["groups"]),
        )
    if partial is not None:  # before any service loads: a carry that does not fit the config is refused first
        partial.load_state_dict({**state["partial"], "tensors": load_file(str(path / CARRY_FILE))})
    for role in algorithm.trained:
        mesh.load(role, path / role)
    sampler.load_state_dict(state["sampler"])
    algorithm.load_state_dict(state["algorithm"])
    torch.set_rng_state(torch.tensor(state["torch_rng"], dtype=torch.uint8))
    if mesh.has("rollout"):
        mesh.push_weights(version=state["step"], rollback=True)  # the rollout may be ahead (given by address)
    log.info("resumed from %s (step %d)", path, state["step"])
    return state["step"]


def link_final_model(run_dir: pathlib.Path, checkpoint: pathlib.Path) -> None:
    """run_dir/hf -> the last checkpoint's HF export, the folder to hand to the next stage (a LoRA actor's:
    the adapter merged in); run_dir/hf_adapter -> its peft adapter folder, where the actor trained one."""
    for name in ("hf", "hf_adapter"):
        link, target = run_dir / name, checkpoint / "actor" / name
        if link.is_symlink() or link.exists():
            link.unlink()
        if name == "hf" or target.is_dir():
            link.symlink_to(target.relative_to(run_dir))
