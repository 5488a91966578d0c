"""The run config and the services' own settings cannot drift apart (as verl checks its generated config):
every setting of a service is reachable from the run config under the same name and default, or listed
here as set another way; and what the run would give a service is what the service parses back."""

import dataclasses
import importlib
import pkgutil

import pytest

from meshrl.config.actor import ActorServiceConfig, EngineConfig, OptimConfig
from meshrl.config.checked import Checked
from meshrl.config.env import EnvConfig
from meshrl.config.losses import DPOParams, PPOParams, SFTParams, ValueParams
from meshrl.config.rollout import RolloutConfig
from orchestrator import config as run_config

# service setting -> how the run sets it, where not by the same name in the section
SET_ELSEWHERE = {
    (EngineConfig, "seed"): "trainer.seed",
    (OptimConfig, "total_steps"): "trainer.total_steps (the schedule advances once per step)",
    (OptimConfig, "betas"): "AdamW's defaults (not a run setting)",
    (RolloutConfig, "model"): "actor.model (the rollout serves the policy)",
    (RolloutConfig, "seed"): "trainer.seed",
    (RolloutConfig, "cpus"): "rollout.replicas (each replica of a CPU fleet its share of the cores)",
    (RolloutConfig, "routed_experts"): "actor.router_replay=r3 or actor.router_agreement (the update reads them)",
    (EnvConfig, "max_episodes"): "service-only: a limit of the service's own",
    (EnvConfig, "idle_timeout"): "service-only",
    (EnvConfig, "max_action_chars"): "service-only",
    (ActorServiceConfig, "role"): "the run's roles (actor, ref, critic, a teacher in the ref role)",
    (ActorServiceConfig, "model"): "actor.model (critic.model, teacher.model)",
    (ActorServiceConfig, "checkpoint_root"): "trainer.run_dir",
    (ActorServiceConfig, "local_ranks"): "meshrl ray's placement (ray.rank_strategy)",
    (ActorServiceConfig, "group_port"): "meshrl ray's placement",
}
# service config -> (the settings class the run's section is made of, the section), found below


def service_settings() -> list[tuple[type, type, type]]:
    """(service config, settings class, run section) for each settings class of meshrl/config a run section
    is made of and each config of meshrl/config built on it (a service's flags or an update's parameters):
    found from the classes themselves, so a new section or service cannot be left out of this test."""
    import inspect

    import meshrl.config as package

    modules = [importlib.import_module(f"meshrl.config.{m.name}") for m in pkgutil.iter_modules(package.__path__)]
    configs = [
        c
        for m in modules
        for _, c in inspect.getmembers(m, inspect.isclass)
        if dataclasses.is_dataclass(c) and c.__module__ == m.__name__ and c.__name__.endswith(("Config", "Params"))
    ]
    found = []
    for section in run_config.SECTIONS.values():
        for settings in section.__mro__[1:]:
            if settings.__module__.startswith("meshrl.config.") and settings is not Checked:
                if settings in configs or any(settings in c.__mro__[1:] for c in configs):
                    found += [(c, settings, section) for c in configs if issubclass(c, settings)]
    return sorted(set(found), key=lambda t: (t[0].__name__, t[1].__name__, t[2].__name__))


SECTIONS = service_settings()
SERVICES = [t for t in SECTIONS if not t[0].__name__.endswith("Params")]  # an update's are set by params.py


def test_the_tables_are_found_not_listed():
    """The classes this file checks are found (service_settings), and include the ones each role's service
    and each update are built from."""
    pairs = {(c.__name__, s.__name__) for c, s, _ in SECTIONS}
    assert {("EngineConfig", "EngineSettings"), ("OptimConfig", "OptimSettings")} <= pairs
    assert {
        ("RolloutConfig", "RolloutSettings"),
        ("RewardConfig", "RewardConfig"),
        ("EnvConfig", "EnvSettings"),
    } <= pairs
    assert {("PPOParams", "PolicyLossSettings"), ("PPOParams", "RolloutISSettings")} <= pairs


def default(field: dataclasses.Field):
    return field.default if field.default is not dataclasses.MISSING else field.default_factory()


@pytest.mark.parametrize("service, settings, section", SERVICES, ids=lambda c: c.__name__)
def test_every_service_setting_is_reachable_with_the_services_default(service, settings, section):
    run_fields = {f.name: f for f in dataclasses.fields(section)}
    for f in dataclasses.fields(service):
        if (service, f.name) in SET_ELSEWHERE:
            assert f.name not in {g.name for g in dataclasses.fields(settings)}, "listed, but the run sets it"
            continue
        assert f.name in run_fields, f"{service.__name__}.{f.name} cannot be set from the run config"
        assert default(run_fields[f.name]) == default(f), (
            f"{section.__name__}.{f.name} defaults to {default(run_fields[f.name])!r}, the service to {default(f)!r}"
        )


@pytest.mark.parametrize("service, settings, section", SECTIONS, ids=lambda c: c.__name__)
def test_each_run_section_is_made_of_its_services_settings(service, settings, section):
    """Not a copy that could drift: the same class, so the same fields, defaults, documentation and checks."""
    assert issubclass(service, settings) and issubclass(section, settings)


def test_a_check_reads_right_in_the_service_and_in_the_run():
    with pytest.raises(ValueError, match=r"^lr=-1.0 must be > 0$"):
        OptimConfig(lr=-1.0)
    with pytest.raises(ValueError, match=r"^actor.lr=-1.0 must be > 0$"):
        run_config.load_config(None, ["actor.lr=-1"])
    with pytest.raises(ValueError, match=r"^reward.function and reward.model both set"):
        run_config.load_config(None, ["reward.function=f.py:f", "reward.model=m"])


def test_the_loss_parameters_a_run_sends_are_the_actors_classes():
    from orchestrator.loops.params import dpo_params, ppo_params, sft_params, value_params

    cfg = run_config.load_config(
        None, ["actor.clip_ratio_high=0.28", "algorithm.rollout_is=token", "actor.ppo_epochs=2"]
    )
    ppo = PPOParams(**ppo_params(cfg))  # every key a PPOParams field, every value in range
    assert (ppo.clip_ratio_high, ppo.rollout_is, ppo.ppo_epochs) == (0.28, "token", 2)
    assert {f.name for f in dataclasses.fields(PPOParams)} == set(ppo_params(cfg))
    ValueParams(**value_params(cfg)), DPOParams(**dpo_params(cfg)), SFTParams(**sft_params(cfg))


# a name declared by two settings classes: each entry one key per role or service (or a service's flag the
# run fills from its own key, SET_ELSEWHERE), never one setting written twice; a new pair must be added here
# with its reason, or declared once and composed (as DPOSettings, Aggregation and RankSettings are)
ONE_PER_ROLE = {
    "address": "every service's own (actor.address, rollout.address, ...)",
    "model": "each model's own folder (actor, critic, teacher, judge, reward) and the services' flag for it",
    "colocate": "rollout.colocate (the rollout on the actor's GPU) and ray.colocate (roles sharing bundles)",
    "concurrency": "rollout.concurrency (episodes at once) and judge.concurrency (its calls at once)",
    "replicas": "the rollout's fleet and the judge's",
    "max_new_tokens": "the policy's responses and the judge's verdicts",
    "temperature": "the policy's sampling, the judge's, and the updates' copy of the rollout's",
    "function": "reward.function and judge.function, each its own program",
    "url": "reward.url and judge.url, each its own server",
    "timeout": "reward.timeout and judge.timeout",
    "error_score": "reward.error_score and env.error_score, each service's failures",
    "workers": "reward.workers and env.workers, each service's pool",
    "lr": "critic.lr: the critic's own optimizer beside the actor's OptimSettings (another default)",
    "lora_rank": "critic.lora_rank: the critic's own adapter beside the actor's",
    "reward": "the reward section, and env.reward (which scores an episode)",
    "role": "the actor service's role flag, and an update's loss role",
    "seed": "trainer.seed, the services' flag filled from it, and an update's mini-batch order",
    "shuffle": "data.shuffle (the data's order) and an update's mini-batch order",
    "total_steps": "trainer.total_steps and the optimizer schedule's flag filled from it",
}


def settings_classes() -> list[type]:
    """Every settings dataclass of meshrl/config, the run sections and what they are made of."""
    import inspect

    import meshrl.config as package

    modules = [importlib.import_module(f"meshrl.config.{m.name}") for m in pkgutil.iter_modules(package.__path__)]
    found = {c for m in modules for _, c in inspect.getmembers(m, inspect.isclass) if dataclasses.is_dataclass(c)}
    found |= {c for s in run_config.SECTIONS.values() for c in s.__mro__ if dataclasses.is_dataclass(c)}
    return sorted(found | {run_config.Config}, key=lambda c: f"{c.__module__}.{c.__qualname__}")


def test_each_setting_is_declared_once():
    """A field is declared by one class: none redeclares what a base declares, and a name two classes
    declare is one key per role (ONE_PER_ROLE), not one setting written twice (which would drift)."""
    where: dict[str, list[str]] = {}
    for c in settings_classes():
        own = c.__dict__.get("__annotations__", {})
        for base in c.__mro__[1:]:
            again = set(own) & set(base.__dict__.get("__annotations__", {}))
            assert not again, f"{c.__qualname__} declares {sorted(again)} again, as {base.__qualname__} does"
        for name in own:
            where.setdefault(name, []).append(c.__qualname__)
    twice = {name: classes for name, classes in where.items() if len(classes) > 1}
    unexplained = {name: classes for name, classes in twice.items() if name not in ONE_PER_ROLE}
    assert not unexplained, f"declared in more than one settings class: {unexplained}"
    assert not set(ONE_PER_ROLE) - set(twice), "ONE_PER_ROLE lists names declared once now: drop them"
