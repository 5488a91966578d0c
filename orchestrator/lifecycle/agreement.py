"""Services given by address run with the run's settings, or the run stops before its first step.

A service the run starts gets its settings as flags (roles.serve_args). One given by address (docker
compose, Ray, by hand) was started with whatever its own command line said, so each reports its
settings in Describe (details["settings"]) and the run compares them with what its config would have
given it (mesh.settings): a difference stops the run with one line per key, naming both values, or with
trainer.given_settings=adopt the run takes the service's value, so that config.yaml records what was
really used. Settings that only place or size a service (its model path on its host, ranks, engine
memory, workers) are its own business and not compared.
"""

import json
import logging

import grpc

from meshrl.errors import ServiceError
from orchestrator.config import Config
from orchestrator.lifecycle.fleet import role_of
from orchestrator.lifecycle.mesh import Mesh
from orchestrator.lifecycle.roles import settings

log = logging.getLogger(__name__)

OWN = {
    "model",
    "seed",
    "engine",
    "hsdp_replicate",
    "sequence_parallel",
    "tensor_parallel_size",
    "gpu_memory_utilization",
    "kv_cache_gb",
    "enforce_eager",
    "max_samples",
    "workers",
    "processes",
    "batch_size",
    "max_length",
    "device",
    "cpus",
}
ROLE_SECTION = {"ref": "actor", "teacher": "actor"}  # served with the actor's engine settings
KEYS = {
    ("critic", "lr"): "critic.lr",
    ("actor", "total_steps"): "trainer.total_steps",
    ("critic", "total_steps"): "trainer.total_steps",
}
MODES = ("refuse", "adopt")


def config_key(role: str, field: str) -> str:
    role = role_of(role)  # a replica of the rollout fleet: the rollout's keys
    return KEYS.get((role, field), f"{ROLE_SECTION.get(role, 'actor' if role == 'critic' else role)}.{field}")


def reported(mesh: Mesh, role: str) -> dict | None:
    """The service's settings from Describe; None when it reports none (a server of another make)."""
    try:
        info = mesh[role].describe()
    except ServiceError as e:
        if e.code == grpc.StatusCode.UNIMPLEMENTED:
            return None
        raise
    text = info.details.get("settings")
    return json.loads(text) if text else None


def differences(cfg: Config, role: str, theirs: dict) -> list[tuple[str, object, object]]:
    """(config key, the run's value, the service's) for each compared setting that differs."""
    out: list[tuple[str, object, object]] = []
    for field, ours in settings(cfg, role_of(role)).items():
        if field in OWN or field not in theirs:
            continue
        value = theirs[field]
        if field == "max_lora_rank":  # a capacity: more than the adapter needs is fine
            if isinstance(value, int) and value < ours:
                out.append((config_key(role, field), ours, value))
            continue
        if isinstance(ours, float) and isinstance(value, (int, float)) and float(value) == ours:
            continue
        if value != ours and not (isinstance(ours, tuple) and list(ours) == value):
            out.append((config_key(role, field), ours, value))
    return out


def agree(cfg: Config, mesh: Mesh, given: set[str]) -> bool:
    """Compare every given service's settings with the config; True when values were adopted (the caller
    saves the config again). ValueError naming every difference under trainer.given_settings=refuse."""
    if cfg.trainer.given_settings not in MODES:
        raise ValueError(f"trainer.given_settings must be one of {MODES}, got {cfg.trainer.given_settings!r}")
    found = []
    for role in sorted((given - {"judge"}) & set(mesh.clients)):  # a judge given runs as its owner set it
        theirs = reported(mesh, role)
        if theirs is None:
            log.info("%s at %s reports no settings: they are not compared with the config", role, mesh[role].address)
            continue
        found += [(role, *d) for d in differences(cfg, role, theirs)]
    if not found:
        return False
    if cfg.trainer.given_settings == "refuse":
        raise ValueError(
            "services given by address run with other settings than the config: "
            + "; ".join(
                f"{role} at {mesh[role].address} has {key.split('.', 1)[1]}={value!r}, the config {key}={ours!r}"
                for role, key, ours, value in found
            )
            + ". Start them with the config's settings, or set "
            "trainer.given_settings=adopt to use theirs"
        )
    for role, key, ours, value in found:
        section, name = key.split(".", 1)
        setattr(getattr(cfg, section), name, value)
        log.warning(
            "%s: the config said %r; %s at %s runs with %r, which this run uses",
            key,
            ours,
            role,
            mesh[role].address,
            value,
        )
    return True


def same_tokenizer(mesh: Mesh) -> None:
    """The teacher reads token ids as the actor does, from the fingerprints both report (a teacher given by
    address has no folder here to read). One that reports none (another make of server) is not checked."""
    if not mesh.has("teacher"):
        return
    actor, teacher = (mesh[role].describe().details.get("tokenizer", "") for role in ("actor", "teacher"))
    if actor and teacher and actor != teacher:
        raise ValueError(
            f"the teacher at {mesh['teacher'].address} has another tokenizer than the actor's (fingerprints "
            f"{teacher} and {actor}, meshrl.vocab): distillation needs the student's tokenizer"
        )
