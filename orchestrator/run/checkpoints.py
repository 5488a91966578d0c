"""A run's checkpoints: what save writes (each trained service's own checkpoint and orchestrator.json),
what resume restores, and the run folder's link to the final model.

checkpoints/step_N/ holds actor/, critic/ (the services write them, DCP, each signed
with an integrity.json the service checks before loading: services/actor/integrity.py)
and orchestrator.json (step, data position, RNG state, the algorithm's own state);
checkpoints/latest names the newest complete one.
"""

import json
import logging
import pathlib

import torch

from orchestrator.lifecycle.mesh import Mesh
from orchestrator.loops.algorithm import Algorithm

log = logging.getLogger(__name__)


def save(
    run_dir: pathlib.Path, number: int, mesh: Mesh, algorithm: Algorithm, sampler_state: dict, last: bool
) -> pathlib.Path:
    """Step `number`'s checkpoint: the trained services' own, and orchestrator.json (`sampler_state`: the
    data position after the step's batch); `last` also exports the actor as HF."""
    path = run_dir / "checkpoints" / f"step_{number}"
    for role in algorithm.trained:
        mesh.save(role, path / role, export_hf=last and role == "actor")
    state = {
        "step": number,
        "sampler": sampler_state,
        "algorithm": algorithm.state_dict(),
        "torch_rng": torch.get_rng_state().tolist(),
    }
    (path / "orchestrator.json").write_text(json.dumps(state))
    (run_dir / "checkpoints" / "latest").write_text(path.name)  # written last: a half-saved step is not "latest"
    return path


def resume(run_dir: pathlib.Path, mesh: Mesh, algorithm: Algorithm, sampler) -> int:
    """Restore the latest checkpoint into the services, the sampler and the algorithm; its step (0: none)."""
    latest = run_dir / "checkpoints" / "latest"
    if not latest.is_file():
        log.info("no checkpoint in %s: starting from step 1", run_dir)
        return 0
    path = run_dir / "checkpoints" / latest.read_text().strip()
    state = json.loads((path / "orchestrator.json").read_text())
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
