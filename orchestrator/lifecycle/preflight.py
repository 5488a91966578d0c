"""Checks of a run's config that need no service: run before anything starts, one clear line each.

    check(cfg, roles)   # ValueError naming the key and the fix

Everything a service would refuse later (after its engine loaded, or at step
1) and that the config alone decides is checked here: the model folder and
data files, the weight transport, the reward function, engine and world
sizes, sequence lengths and the loggers' packages. Services started
elsewhere (an `address` given) are checked only where the config says what
they must be.
"""

import ast
import dataclasses
import importlib.util
import logging
import math
import pathlib

from meshrl import hosts
from meshrl.algos.losses import ROLLOUT_IS
from meshrl.config.actor import ENGINE_NAMES
from meshrl.config.reward import ON_ERROR
from meshrl.config.rollout import BACKENDS, ON_UPDATE
from meshrl.weights import DTYPES, TRANSPORTS
from orchestrator.config import Config
from orchestrator.data import check_inputs

log = logging.getLogger(__name__)

# The services' own choices (meshrl/config), checked here before anything starts; the run adds "auto" (plain
# for one rank, fsdp2 for several).
ENGINES = ("auto", *ENGINE_NAMES)
ENV_REWARDS = ("env", "service", "sum")
LOGGER_PACKAGES = {"wandb": "wandb", "mlflow": "mlflow"}
MAX_CHUNKS = 16  # the rollout serves 16 calls at once (meshrl.rpc.server's max_workers)


def check(cfg: Config, roles: set[str], local: bool = True) -> None:
    """local: the services start on this machine (not placed by Ray), so its GPUs bound their ranks."""
    check_inputs(cfg)
    check_run_dir(cfg)
    check_numbers(cfg, roles)
    check_addresses(cfg, roles)
    warn_unread(cfg, roles)
    if "rollout" in roles:
        check_rollout(cfg)
    if cfg.rollout.multi_turn:
        check_multi_turn(cfg, roles)
    if "reward" in roles and not cfg.reward.address:
        check_reward(cfg)
    for role in ("actor", "ref", "critic"):
        if role in roles and not getattr(cfg, role).address:
            check_ranks(cfg, role, sampled="rollout" in roles)
            if local:
                check_devices(cfg, role, hosts.gpus())
    for name, package in LOGGER_PACKAGES.items():
        if name in cfg.trainer.logger and importlib.util.find_spec(package) is None:
            raise ValueError(
                f"trainer.logger includes {name}, but the {package} package is not installed "
                f"(pip install {'mlflow-skinny' if name == 'mlflow' else name})"
            )


def check_run_dir(cfg: Config) -> None:
    """A run folder that is named, a folder, and keeps its checkpoints inside it (the services it starts
    write them only under it: a symlinked checkpoints/ would fail at the first save)."""
    if not cfg.trainer.run_dir.strip():
        raise ValueError("trainer.run_dir is empty: name the run's folder (e.g. runs/my_run)")
    run_dir = pathlib.Path(cfg.trainer.run_dir).expanduser()
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"trainer.run_dir={cfg.trainer.run_dir} is a file, not a folder")
    checkpoints = run_dir / "checkpoints"
    if checkpoints.is_symlink() or checkpoints.exists() and run_dir.resolve() not in checkpoints.resolve().parents:
        raise ValueError(
            f"{checkpoints} is a link to {checkpoints.resolve()}: the services write checkpoints only "
            "inside trainer.run_dir; remove the link (or point trainer.run_dir where they should go)"
        )


def check_numbers(cfg: Config, roles: set[str]) -> None:
    """Every number is finite, and the ones a service would take only to fail on are in range."""
    for section in dataclasses.fields(cfg):
        values = getattr(cfg, section.name)
        for f in dataclasses.fields(values):
            v = getattr(values, f.name)
            if isinstance(v, float) and not math.isfinite(v):
                raise ValueError(f"{section.name}.{f.name}={v} must be a finite number")
    for role in ("actor", "critic"):
        if role in roles and not getattr(cfg, role).address:
            lr = getattr(cfg, role).lr
            if not lr > 0:
                raise ValueError(f"{role}.lr={lr} must be > 0")
    if "rollout" in roles:
        r = cfg.rollout
        if r.temperature < 0:
            raise ValueError(f"rollout.temperature={r.temperature} must be >= 0 (0: greedy)")
        if not 0 < r.top_p <= 1 or r.top_k == 0 or r.top_k < -1:
            raise ValueError(f"rollout.top_p={r.top_p} must be in (0, 1] and rollout.top_k={r.top_k} -1 (off) or >= 1")


def check_addresses(cfg: Config, roles: set[str]) -> None:
    """HOST:PORT with a port a socket can have: a bad one otherwise shows only as a service not answering."""
    for role in sorted(roles):
        address = getattr(getattr(cfg, role, None), "address", "")
        if not address:
            continue
        if not hosts.is_address(address):
            raise ValueError(f"{role}.address={address} must be HOST:PORT with a port in 1..65535")


def warn_unread(cfg: Config, roles: set[str]) -> None:
    """Settings of a section whose service this run does not use (rollout.* for sft) do nothing: say so."""
    for section in ("ref", "critic", "rollout", "reward", "env"):
        if section in roles:
            continue
        values, default = getattr(cfg, section), type(getattr(cfg, section))()
        changed = [f.name for f in dataclasses.fields(values) if getattr(values, f.name) != getattr(default, f.name)]
        if changed:
            log.warning(
                "%s: set, but this run uses no %s service, so they do nothing",
                ", ".join(f"{section}.{k}" for k in changed),
                section,
            )


def check_rollout(cfg: Config) -> None:
    r = cfg.rollout
    if r.backend not in BACKENDS:
        raise ValueError(f"rollout.backend={r.backend} must be one of {BACKENDS}")
    if r.weight_transport not in TRANSPORTS:
        raise ValueError(f"rollout.weight_transport={r.weight_transport} must be one of {TRANSPORTS}")
    if r.dtype not in DTYPES:  # the engine's, and what the actor's weights are sent as
        raise ValueError(f"rollout.dtype={r.dtype} must be one of {DTYPES}")
    if r.weight_bucket_mb < 1:
        raise ValueError(f"rollout.weight_bucket_mb={r.weight_bucket_mb} must be >= 1")
    if r.weight_transport == "cuda_ipc" and not (cfg.actor.address and r.address):
        import torch

        if not torch.cuda.is_available():
            raise ValueError(
                "rollout.weight_transport=cuda_ipc needs the actor and rollout on one GPU, and this "
                "machine has none: use shm (same host) or stream"
            )
    al = cfg.algorithm  # read by the actor only at the first update, after a whole generation
    if al.rollout_is not in ROLLOUT_IS:
        raise ValueError(f"algorithm.rollout_is={al.rollout_is} must be one of {ROLLOUT_IS}")
    if not al.rollout_is_cap >= 1:
        raise ValueError(f"algorithm.rollout_is_cap={al.rollout_is_cap} must be >= 1")
    if r.colocate and cfg.trainer.max_staleness:
        raise ValueError(
            "rollout.colocate gives the GPU to generation and training in turn, and "
            "trainer.max_staleness runs them at once: set one of them off"
        )
    if r.chunks < 1 or r.chunks > MAX_CHUNKS:
        raise ValueError(f"rollout.chunks={r.chunks} must be in 1..{MAX_CHUNKS} (concurrent Generate calls a step)")
    if r.on_update not in ON_UPDATE:
        raise ValueError(f"rollout.on_update must be one of {ON_UPDATE}, got {r.on_update!r}")
    if r.n < 1 or r.max_new_tokens < 1:
        raise ValueError(f"rollout.n={r.n} and rollout.max_new_tokens={r.max_new_tokens} must be >= 1")
    if r.max_new_tokens >= r.max_model_len:
        raise ValueError(
            f"rollout.max_new_tokens={r.max_new_tokens} leaves no room for a prompt in "
            f"rollout.max_model_len={r.max_model_len}"
        )
    room = r.max_model_len - r.max_new_tokens
    if cfg.data.max_prompt_length > room:
        raise ValueError(
            f"data.max_prompt_length={cfg.data.max_prompt_length} + rollout.max_new_tokens="
            f"{r.max_new_tokens} exceeds rollout.max_model_len={r.max_model_len}: raise "
            f"max_model_len or lower one of the others"
        )


def check_multi_turn(cfg: Config, roles: set[str]) -> None:
    r = cfg.rollout
    if "env" not in roles:
        raise ValueError("rollout.multi_turn works with ppo, grpo, rloo and reinforce")
    if r.max_turns < 1 or r.concurrency < 1 or r.max_response_tokens < 0:
        raise ValueError(
            f"rollout.max_turns={r.max_turns} and rollout.concurrency={r.concurrency} must be >= 1, "
            f"rollout.max_response_tokens={r.max_response_tokens} >= 0"
        )
    budget = r.max_response_tokens or r.max_turns * r.max_new_tokens
    if cfg.data.max_prompt_length + budget > r.max_model_len:
        raise ValueError(
            f"data.max_prompt_length={cfg.data.max_prompt_length} + a multi-turn response of up to "
            f"{budget} tokens (rollout.max_response_tokens, or max_turns x max_new_tokens) exceeds "
            f"rollout.max_model_len={r.max_model_len}"
        )
    if cfg.env.reward not in ENV_REWARDS:
        raise ValueError(f"env.reward must be one of {ENV_REWARDS}, got {cfg.env.reward!r}")
    if not cfg.env.address and ":" not in cfg.env.module:
        raise ValueError(f"env.module={cfg.env.module} must look like package.module:Class or path/to/file.py:Class")


def check_reward(cfg: Config) -> None:
    rw = cfg.reward
    if rw.on_error not in ON_ERROR:
        raise ValueError(f"reward.on_error={rw.on_error} must be one of {ON_ERROR}")
    if rw.batched and not rw.function:
        raise ValueError("reward.batched=true applies to a user function: set reward.function too")
    if rw.function and rw.model:
        raise ValueError("reward.function and reward.model both set: a sample is scored by one of them")
    if rw.function:
        check_function_spec(rw.function)
    if rw.model and not (pathlib.Path(rw.model) / "config.json").is_file():
        raise ValueError(f"reward.model={rw.model} is not a HuggingFace model folder (no config.json there)")
    if rw.batch_size < 1 or rw.max_length < 1:
        raise ValueError(f"reward.batch_size={rw.batch_size} and reward.max_length={rw.max_length} must be >= 1")


def check_function_spec(spec: str) -> None:
    """The file exists, parses, and defines the function at top level (read, not run: running user code
    is the reward service's job, in its own processes)."""
    path, sep, name = spec.rpartition(":")
    if not sep or not path or not name:
        raise ValueError(f"reward.function={spec} must look like path/to/file.py:function_name")
    file = pathlib.Path(path).expanduser()
    if not file.is_file():
        raise ValueError(f"reward.function={spec}: file {file} not found")
    try:
        tree = ast.parse(file.read_text(), str(file))
    except SyntaxError as e:
        raise ValueError(f"reward.function={spec}: {file} line {e.lineno}: {e.msg}") from None
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    defined |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    defined |= {
        (a.asname or a.name).split(".")[0]
        for n in tree.body
        if isinstance(n, (ast.Import, ast.ImportFrom))
        for a in n.names
    }
    if name not in defined:
        functions = sorted(n.name for n in tree.body if isinstance(n, ast.FunctionDef))
        raise ValueError(f"reward.function={spec}: {file} defines no {name!r} (functions there: {functions})")


def check_devices(cfg: Config, role: str, gpus: int) -> None:
    """One rank per GPU: NCCL refuses two ranks of a group on one device, but only at the first call."""
    world = getattr(cfg, role).world_size
    if gpus and world > gpus:
        raise ValueError(
            f"{role}.world_size={world} puts {world} ranks on this machine's {gpus} GPU(s), and NCCL "
            f"refuses two ranks on one device: set {role}.world_size=auto (one per GPU) or at most {gpus}"
        )


def check_ranks(cfg: Config, role: str, sampled: bool) -> None:
    """The engine and world size fit each other and the rows a step gives each rank."""
    world = getattr(cfg, role).world_size
    engine = cfg.actor.engine
    if engine not in ENGINES:
        raise ValueError(f"actor.engine={engine} must be one of {ENGINES}")
    if world < 1:
        raise ValueError(f"{role}.world_size={world} must be >= 1")
    if engine == "plain" and world != 1:
        raise ValueError(
            f"actor.engine=plain runs one process: set {role}.world_size=1 (it is {world}), or use engine fsdp2"
        )
    rows = cfg.data.train_batch_size * (cfg.rollout.n if sampled else 1)
    if world > rows:
        how = f"data.train_batch_size={cfg.data.train_batch_size}" + (
            f" x rollout.n={cfg.rollout.n}" if sampled else ""
        )
        raise ValueError(
            f"{role}.world_size={world} is more ranks than the {rows} rows of a step ({how}): "
            "lower the world size or raise the batch"
        )
