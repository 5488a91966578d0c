"""The run config and the services' own settings cannot drift apart (as verl checks its generated config):
every setting of a service is reachable from the run config under the same name and default, or listed
here as set another way; and what the run would give a service is what the service parses back."""

import dataclasses

import pytest

from meshrl.config.actor import EngineConfig, OptimConfig
from meshrl.config.env import EnvConfig
from meshrl.config.reward import RewardConfig
from meshrl.config.rollout import RolloutConfig
from orchestrator import config as run_config

# service setting -> how the run sets it, where not by the same name in the section
SET_ELSEWHERE = {
    (EngineConfig, "seed"): "trainer.seed",
    (EngineConfig, "engine"): "actor.engine (auto: plain for one rank, fsdp2 for several, as the service)",
    (OptimConfig, "total_steps"): "trainer.total_steps (the schedule advances once per step)",
    (OptimConfig, "betas"): "AdamW's defaults (not a run setting)",
    (RolloutConfig, "model"): "actor.model (the rollout serves the policy)",
    (RolloutConfig, "seed"): "trainer.seed",
    (EnvConfig, "env"): "env.module",
    (EnvConfig, "workers"): "max(env.workers, rollout.concurrency)",
    (EnvConfig, "max_episodes"): "service-only: a limit of the service's own",
    (EnvConfig, "idle_timeout"): "service-only",
    (EnvConfig, "max_action_chars"): "service-only",
    (EnvConfig, "processes"): "service-only: how the service spreads its episodes",
}
SECTIONS = [
    (EngineConfig, run_config.ActorSection),
    (OptimConfig, run_config.ActorSection),
    (RolloutConfig, run_config.RolloutSection),
    (RewardConfig, run_config.RewardSection),
    (EnvConfig, run_config.EnvSection),
]


def default(field: dataclasses.Field):
    return field.default if field.default is not dataclasses.MISSING else field.default_factory()


@pytest.mark.parametrize("service, section", SECTIONS, ids=lambda c: c.__name__)
def test_every_service_setting_is_reachable_with_the_services_default(service, section):
    run_fields = {f.name: f for f in dataclasses.fields(section)}
    for f in dataclasses.fields(service):
        if (service, f.name) in SET_ELSEWHERE:
            continue
        assert f.name in run_fields, f"{service.__name__}.{f.name} cannot be set from the run config"
        assert default(run_fields[f.name]) == default(f), (
            f"{section.__name__}.{f.name} defaults to {default(run_fields[f.name])!r}, the service to {default(f)!r}"
        )
