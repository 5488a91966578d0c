"""What a run's config asks of the services: which roles run (service_roles, wanted), and what each is
started with or must report when given by address (settings, serve_args), from the services' own config
classes (meshrl/config), so that the flags and the agreement check read one table."""

import pathlib

from meshrl import hosts
from meshrl.config.actor import ActorServiceConfig, EngineConfig, EngineSettings, OptimConfig, OptimSettings, engine_for
from meshrl.config.checked import values_of
from meshrl.config.env import EnvConfig, EnvSettings
from meshrl.config.reward import RewardConfig
from meshrl.config.rollout import RolloutConfig, RolloutSettings
from meshrl.flags import dataclass_args
from orchestrator.config import Config, ranks
from orchestrator.lifecycle.fleet import replica_address, replica_names

MODELS = ("actor", "ref", "teacher", "critic")  # the roles an actor service serves, each its own process group
FROZEN = ("ref", "teacher")  # served in the ref role: log-probs, no optimizer


def served_role(role: str) -> str:
    """The actor service's --role for a model role: the teacher is served as a ref (frozen, log-probs)."""
    return "ref" if role in FROZEN else role


CONFIGS = {"rollout": RolloutConfig, "reward": RewardConfig, "env": EnvConfig}  # one config class: one flag set


def absolute(path) -> str:
    """Paths go to the services absolute: theirs resolve relative ones from their own checkpoint root."""
    return str(pathlib.Path(path).resolve())


def settings(cfg: Config, role: str) -> dict:
    """The settings (service config field -> value) a role gets from the run config: what serve_args
    writes as flags for a service the run starts, and what one given by address must report (Describe).
    A section holds its service's settings classes (meshrl/config); the rest is filled in here."""
    a, seed = cfg.actor, cfg.trainer.seed
    if role == "rollout":
        return {
            **values_of(RolloutSettings, cfg.rollout),
            "model": a.model,
            "seed": seed,
            "max_lora_rank": lora_rank_served(cfg),
            "routed_experts": a.rollout_experts(),
        }
    if role == "reward":
        return values_of(RewardConfig, cfg.reward)
    if role == "judge":  # a frozen model on the rollout's engine settings; greedy judgements need no seed
        return {**values_of(RolloutSettings, cfg.rollout), "model": cfg.judge.model, "seed": seed}
    if role == "env":  # a call beyond its workers would be RESOURCE_EXHAUSTED
        return {**values_of(EnvSettings, cfg.env), "workers": max(cfg.env.workers, cfg.rollout.concurrency)}
    engine = {**values_of(EngineSettings, a), "engine": engine_for(a.engine, ranks(cfg, role)), "seed": seed}
    engine["lora_rank"] = {"ref": 0, "teacher": 0, "critic": cfg.critic.lora_rank}.get(role, a.lora_rank)
    if role in FROZEN:  # the ref: the base model; the teacher: its own
        return engine
    lr = cfg.critic.lr if role == "critic" else a.lr
    steps = cfg.trainer.total_steps  # the schedule advances once per training step
    return {**engine, **values_of(OptimSettings, a), "lr": lr, "total_steps": steps}


def serve_args(cfg: Config, role: str) -> list[str]:
    """`meshrl serve ...` arguments of a role (actor, ref, critic, rollout, reward, env) from the config,
    written from the services' own config classes (meshrl.flags)."""
    values = settings(cfg, role)
    if role == "judge":
        return ["rollout", *dataclass_args(RolloutConfig, values)]
    if role in CONFIGS:
        return [role, *dataclass_args(CONFIGS[role], values)]
    model = {"critic": cfg.critic.model or cfg.actor.model, "teacher": cfg.teacher.model}.get(role, cfg.actor.model)
    what = dataclass_args(ActorServiceConfig, {"role": served_role(role), "model": model})  # said first
    threads = getattr(cfg, role).threads or cfg.actor.threads  # a frozen model or the critic: the actor's by default
    where: dict[str, object] = {"world_size": ranks(cfg, role), "threads": threads}
    where["checkpoint_root"] = absolute(cfg.trainer.run_dir)
    args = ["actor", *what, *dataclass_args(ActorServiceConfig, where), *dataclass_args(EngineConfig, values)]
    return args + ([] if role in FROZEN else dataclass_args(OptimConfig, values))


def wanted(cfg: Config, roles: set[str]) -> dict[str, tuple[str, list[str]]]:
    """{role: (its address, or "" to start it; its `meshrl serve` arguments)} for the roles in `roles`."""
    out = {}
    for role in (*MODELS, "rollout", "reward", "env", "judge"):
        if role not in service_roles(cfg, roles):
            continue
        if role == "rollout":  # the fleet: each replica a service of its own, started with the same settings
            args, names = serve_args(cfg, role), replica_names(cfg)
            # on a machine without GPUs replicas would spin against each other on every core: each gets its share
            cores = hosts.share_cores(len(names)) if len(names) > 1 and not hosts.gpus() else None
            out.update(
                {
                    name: (replica_address(cfg, name), [*args, "--cpus", cores[i]] if cores else args)
                    for i, name in enumerate(names)
                }
            )
        elif role == "judge":  # its fleet: as the rollout's, each replica a service of its own
            names, args = cfg.judge.names(), serve_args(cfg, role)
            # without GPUs a judge generating beside the actor's update and the rollout (sampling ahead) would
            # spin its threads against theirs on every core: it gets a share of them, the rest theirs
            cores = None if hosts.gpus() else hosts.share_cores(len(names) + 1)[1:]
            out.update(
                {
                    n: (cfg.judge.address_of(n), [*args, "--cpus", cores[i]] if cores else args)
                    for i, n in enumerate(names)
                }
            )
        else:
            out[role] = (getattr(cfg, role).address, serve_args(cfg, role))
    return out


def lora_rank_served(cfg: Config) -> int:
    """The rollout's max_lora_rank: as configured, or, where the actor trains an adapter and pushes it as it is
    (not rollout.merge_lora), at least the adapter's rank, so that a rollout the run starts can take it."""
    if cfg.actor.lora_rank and not cfg.rollout.merge_lora:
        return max(cfg.rollout.max_lora_rank, cfg.actor.lora_rank)
    return cfg.rollout.max_lora_rank


def delta_push(cfg: Config) -> bool:
    """Whether weight pushes send the changes alone (rollout.push; "auto": over stream with a half-precision
    rollout, where bench/RESULTS.md measured it to pay). Never for a LoRA adapter pushed alone."""
    r = cfg.rollout
    if cfg.actor.lora_rank and not r.merge_lora:
        return False
    if r.push == "auto":
        return r.weight_transport == "stream" and r.dtype in ("bfloat16", "float16")
    return r.push == "delta"


def ref_in_actor(cfg: Config) -> bool:
    """A LoRA actor serves the ref's log-probs itself (its base model), unless a ref service is given."""
    return cfg.actor.lora_rank > 0 and not cfg.ref.address


def service_roles(cfg: Config, roles: set[str]) -> set[str]:
    """The services behind an algorithm's roles: all of them, but the ref where the actor serves it."""
    return roles - {"ref"} if ref_in_actor(cfg) else roles
