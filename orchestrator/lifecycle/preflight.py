"""Checks of a run's config that need no service: run before anything starts, one clear line each.

    check(cfg, roles)   # ValueError naming the key and the fix

One key's own range is checked where the key is defined, when the config is
read (meshrl/config and orchestrator/config.py). What is left here needs more
than one key, or the machine: the model folders (actor, critic, teacher) and data
files, the run folder (not one where a run trained, unless trainer.resume), the
weight transport on this machine, the reward function's file (and its form, and
what it takes from each row against the data: scorer_inputs) or that something
listens at reward.url, engine, world and tensor-parallel sizes
against the batch and the GPUs, a LoRA adapter against the model, sequence
lengths across sections and against the model's positions, the chat template on the tool path
(tool_template), a teacher's tokenizer against the student's, the loggers' packages, and what the actor
model's family cannot do here (meshrl/families.py: packing, a rollout backend, pictures). Services started
elsewhere (an `address` given) are checked only where the config says what they must be. The
rollout's own checks (backends, fleets, sampling, lengths) are in rollout_checks.py.
"""

import ast
import dataclasses
import importlib.util
import json
import logging
import pathlib
import socket
import urllib.parse

from meshrl import hosts
from meshrl.config.actor import EngineSettings
from meshrl.config.checked import values_of
from meshrl.config.reward import urls
from meshrl.config.rollout import ROUTED_ON_CPU
from meshrl.families import check_family
from meshrl.models import check_lora
from meshrl.vocab import difference, folder_tokenizer, special_difference
from orchestrator.agents.pool import check_agent_python
from orchestrator.config import Config
from orchestrator.data import check_inputs
from orchestrator.judge import programs
from orchestrator.lifecycle import scorer_inputs, tool_template
from orchestrator.lifecycle.rollout_checks import check_rollout, check_tensor_parallel, moe_model

log = logging.getLogger(__name__)

LOGGER_PACKAGES = {"wandb": "wandb", "mlflow": "mlflow"}


def check(cfg: Config, roles: set[str], local: bool = True) -> None:
    """local: the services start on this machine (not placed by Ray), so its GPUs bound their ranks."""
    check_inputs(cfg)
    check_model_folders(cfg, roles)
    check_family(cfg, roles)  # what the model's family cannot do here (meshrl/families.py), from its config
    check_run_dir(cfg)
    check_addresses(cfg, roles)
    warn_unread(cfg, roles)
    if "rollout" in roles:
        check_rollout(cfg)
        if local:
            check_tensor_parallel(cfg, hosts.gpus())
    if cfg.rollout.episodes:
        check_multi_turn(cfg, roles)
    if cfg.rollout.agent.partition(":")[0].endswith(".py"):
        check_function_spec(cfg.rollout.agent, "rollout.agent")
    check_agent_python(cfg.rollout)  # the named Python runs and imports the agent, before anything starts
    tool_template.check(cfg, roles)  # on the tool path: the chat template renders tools, calls and results
    if "reward" in roles and not cfg.reward.address:
        check_reward(cfg)
        if local and cfg.reward.url:  # Ray may place the service where other hosts can be reached
            for url in urls(cfg.reward.url):
                check_reward_url(url)
    if "teacher" in roles and not cfg.teacher.address:
        check_teacher(cfg)
    if cfg.judge.given:
        check_judge(cfg, roles)
    check_router(cfg)
    for role in ("actor", "ref", "teacher", "critic"):
        if role in roles and not getattr(cfg, role).address:
            check_ranks(cfg, role, sampled="rollout" in roles)
            check_adapter(cfg, role)
            if local:
                check_devices(cfg, role, hosts.gpus())
    for name, package in LOGGER_PACKAGES.items():
        if name in cfg.trainer.logger and importlib.util.find_spec(package) is None:
            raise ValueError(
                f"trainer.logger includes {name}, but the {package} package is not installed "
                f"(pip install {'mlflow-skinny' if name == 'mlflow' else name})"
            )


def check_model_folders(cfg: Config, roles: set[str]) -> None:
    """The critic's and the teacher's model folders hold a model, as the actor's must (check_inputs): their
    service would otherwise fail to load it only after every other service has started."""
    for role in ("critic", "teacher", "judge"):
        section = getattr(cfg, role)
        if role in roles and not section.address and section.model:
            if not (pathlib.Path(section.model) / "config.json").is_file():
                raise ValueError(
                    f"{role}.model={section.model} is not a HuggingFace model folder (no config.json there)"
                )


def check_judge(cfg: Config, roles: set[str]) -> None:
    """Before anything starts: the rubric's fields, a judge function that loads, a judge to ask, and a
    group to compare within (pairwise)."""
    j = cfg.judge
    if "rollout" not in roles:
        raise ValueError("judge.* grades sampled answers, and this command samples none: leave judge.* empty")
    if not (j.model or j.address or j.url):
        raise ValueError("judge.function asks a judge: name one with judge.model, judge.address or judge.url")
    programs.template_text(j.template, j.mode)
    if j.function.partition(":")[0].endswith(".py"):
        check_function_spec(j.function, "judge.function")
    if j.mode == "pairwise" and cfg.rollout.n < 2:
        raise ValueError(f"judge.mode=pairwise compares a prompt's answers with each other: rollout.n={cfg.rollout.n}")


def check_teacher(cfg: Config) -> None:
    """A teacher folder with the student's tokenizer: distillation compares their log-probs token id by
    token id, which across two vocabularies would train on noise without an error anywhere."""
    if not cfg.teacher.model:
        raise ValueError("teacher.address is empty and teacher.model names no folder: name the teacher's model")
    tokenizers = {}
    for key, path in (("teacher.model", cfg.teacher.model), ("actor.model", cfg.actor.model)):
        try:
            tokenizers[key] = folder_tokenizer(path)
        except (OSError, ValueError) as e:
            raise ValueError(f"{key}={path}: no tokenizer read there ({str(e).splitlines()[0]})") from None
    why = difference(tokenizers["actor.model"], tokenizers["teacher.model"])
    if why:
        raise ValueError(
            f"teacher.model={cfg.teacher.model} has another tokenizer than actor.model={cfg.actor.model} ({why}): "
            "distillation compares their log-probs of the same token ids, so the teacher needs the student's"
        )
    special = special_difference(tokenizers["actor.model"], tokenizers["teacher.model"])
    if special:  # one family's base and instruct models: the same ids, other end tokens
        log.warning("teacher.model's special tokens differ from actor.model's (%s): the student's are used", special)


def check_run_dir(cfg: Config) -> None:
    """A run folder that is named, a folder, holds no other run unless this one resumes it, and keeps its
    checkpoints inside it (the services it starts write them only under it: a symlinked checkpoints/ would
    fail at the first save)."""
    if not cfg.trainer.run_dir.strip():
        raise ValueError("trainer.run_dir is empty: name the run's folder (e.g. runs/my_run)")
    run_dir = pathlib.Path(cfg.trainer.run_dir).expanduser()
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"trainer.run_dir={cfg.trainer.run_dir} is a file, not a folder")
    held = run_held(run_dir)
    if held and not cfg.trainer.resume:  # a fresh run would rewrite its logs and save beside its checkpoints
        raise ValueError(
            f"trainer.run_dir={cfg.trainer.run_dir} holds a run ({held}), whose logs a new run there would "
            "overwrite: continue it with trainer.resume=true, or start afresh in another trainer.run_dir (or "
            "remove that folder)"
        )
    checkpoints = run_dir / "checkpoints"
    if checkpoints.is_symlink() or checkpoints.exists() and run_dir.resolve() not in checkpoints.resolve().parents:
        raise ValueError(
            f"{checkpoints} is a link to {checkpoints.resolve()}: the services write checkpoints only "
            "inside trainer.run_dir; remove the link (or point trainer.run_dir where they should go)"
        )


def run_held(run_dir: pathlib.Path) -> str:
    """What shows that a run trained in the folder ('' where nothing does): its checkpoints, or a training
    step in its metrics.jsonl (a run that failed before its first step leaves only its config and step 0's
    validation, which a fresh run may take over)."""
    latest = run_dir / "checkpoints" / "latest"
    if latest.is_file():
        return f"checkpoints up to {latest.read_text().strip()}"
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        return ""
    with metrics.open() as lines:
        for line in lines:  # step 0 first, if any: step 1 is at most the second line
            try:
                step = json.loads(line).get("step", 0)
            except (ValueError, AttributeError):  # a line cut short by a killed run
                continue
            if isinstance(step, int) and step >= 1:
                return "steps logged in metrics.jsonl"
    return ""


def check_router(cfg: Config) -> None:
    """A router loss or routing replay asked of a model without a router would be ignored: refused instead."""
    asked = {k: getattr(cfg.actor, k) for k in ("router_aux_loss_coef", "router_z_loss_coef")}
    asked["router_replay"] = "" if cfg.actor.replay.afresh else cfg.actor.router_replay
    asked["router_agreement"] = cfg.actor.router_agreement
    if any(asked.values()) and not cfg.actor.address and not moe_model(cfg.actor.model):
        name = next(k for k, v in asked.items() if v)
        raise ValueError(f"actor.{name}={asked[name]}: {cfg.actor.model} is not a mixture of experts (no router)")
    setting = "actor.router_replay=r3" if cfg.actor.replay.rollouts else "actor.router_agreement=true"
    if cfg.actor.rollout_experts() and cfg.rollout.backend == "vllm" and not hosts.gpus():
        raise ValueError(f"{setting} with rollout.backend=vllm: {ROUTED_ON_CPU}")


def check_adapter(cfg: Config, role: str) -> None:
    """A LoRA adapter the model can take (its target layers exist, are linear and are wider than the rank),
    read from the model folder on the meta device: the actor service would refuse it only after the
    other services had started."""
    rank = {"actor": cfg.actor.lora_rank, "critic": cfg.critic.lora_rank}.get(role, 0)
    if not rank:
        return
    model = cfg.critic.model or cfg.actor.model if role == "critic" else cfg.actor.model
    engine = EngineSettings(**{**values_of(EngineSettings, cfg.actor), "lora_rank": rank})
    try:
        check_lora(model, "value" if role == "critic" else "causal", engine)
    except ValueError as e:  # the service's line, under the run's keys
        section = "actor" if str(e).startswith(("lora_target_modules", "lora_experts")) else role
        raise ValueError(f"{section}.{e}") from None


def check_addresses(cfg: Config, roles: set[str]) -> None:
    """HOST:PORT with a port a socket can have: a bad one otherwise shows only as a service not answering."""
    for role in sorted(roles):
        address = getattr(getattr(cfg, role, None), "address", "")
        listed = hosts.address_list(address) if role == "rollout" else [address]  # a fleet: several
        for one in listed if address else []:
            if not hosts.is_address(one):
                what = f"{role}.address={address}" + (f" ({one!r})" if len(listed) > 1 else "")
                raise ValueError(f"{what} must be HOST:PORT with a port in 1..65535")
        if len(set(listed)) < len(listed):
            raise ValueError(f"{role}.address={address} names a replica twice")


def warn_unread(cfg: Config, roles: set[str]) -> None:
    """Settings of a section whose service this run does not use (rollout.* for sft) do nothing: say so."""
    for section in ("ref", "teacher", "critic", "rollout", "reward", "env"):
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


def check_multi_turn(cfg: Config, roles: set[str]) -> None:
    r = cfg.rollout
    if r.max_turns < 1 or r.concurrency < 1 or r.max_response_tokens < 0:
        raise ValueError(
            f"rollout.max_turns={r.max_turns} and rollout.concurrency={r.concurrency} must be >= 1, "
            f"rollout.max_response_tokens={r.max_response_tokens} >= 0"
        )
    budget = r.response_budget
    if cfg.data.max_prompt_length + budget > r.max_model_len:
        raise ValueError(
            f"data.max_prompt_length={cfg.data.max_prompt_length} + a multi-turn response of up to "
            f"{budget} tokens (rollout.max_response_tokens, or max_turns x max_new_tokens) exceeds "
            f"rollout.max_model_len={r.max_model_len}"
        )


def check_reward(cfg: Config) -> None:
    rw = cfg.reward
    if rw.function:
        check_function_spec(rw.function)
    if rw.model and not (pathlib.Path(rw.model) / "config.json").is_file():
        raise ValueError(f"reward.model={rw.model} is not a HuggingFace model folder (no config.json there)")
    scorer_inputs.check(cfg)  # the function's form, and what it takes from each row against the data


def check_reward_url(url: str, timeout: float = 5.0) -> None:
    """Something listens at reward.url's host and port: a TCP connect, nothing sent (a POST would cost the
    server a scoring); otherwise a run finds out at its first step, after every service has started."""
    parts = urllib.parse.urlsplit(url)  # its form is checked when the config is read (meshrl/config/reward.py)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout).close()
    except OSError as e:
        raise ValueError(f"reward.url={url} cannot be reached: {e}") from None


def check_function_spec(spec: str, key: str = "reward.function") -> None:
    """The file exists, parses, and defines the function at top level (read, not run: running user code
    is the reward service's job, or the agent workers', in their own processes)."""
    path, sep, name = spec.rpartition(":")
    if not sep or not path or not name:
        raise ValueError(f"{key}={spec} must look like path/to/file.py:function_name")
    file = pathlib.Path(path).expanduser()
    if not file.is_file():
        raise ValueError(f"{key}={spec}: file {file} not found")
    try:
        tree = ast.parse(file.read_text(), str(file))
    except SyntaxError as e:
        raise ValueError(f"{key}={spec}: {file} line {e.lineno}: {e.msg}") from None
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
        raise ValueError(f"{key}={spec}: {file} defines no {name!r} (functions there: {functions})")


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
    if world < 1:
        raise ValueError(f"{role}.world_size={world} must be >= 1")
    if engine == "plain" and world != 1:
        raise ValueError(
            f"actor.engine=plain runs one process: set {role}.world_size=1 (it is {world}), or use engine fsdp2"
        )
    sp = cfg.actor.sequence_parallel
    if world % sp:
        raise ValueError(
            f"actor.sequence_parallel={sp} splits each sequence over that many ranks of every model service, "
            f"and {role}.world_size={world} is not a multiple of it: set {role}.world_size to one"
        )
    rows = cfg.data.train_batch_size * (cfg.rollout.n if sampled else 1)
    if world // sp > rows:
        how = f"data.train_batch_size={cfg.data.train_batch_size}" + (
            f" x rollout.n={cfg.rollout.n}" if sampled else ""
        )
        raise ValueError(
            f"{role}.world_size={world} is more ranks than the {rows} rows of a step ({how}): "
            "lower the world size or raise the batch"
            + (f" (with actor.sequence_parallel={sp}, {world // sp} groups of ranks hold rows)" if sp > 1 else "")
        )
