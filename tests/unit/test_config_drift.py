"""The run config and the services' own settings cannot drift apart (as verl checks its generated config):
every setting of a service is reachable from the run config under the same name and default, or listed
here as set another way; and what the run would give a service is what the service parses back."""

import dataclasses

import pytest

from meshrl.config.actor import EngineConfig, EngineSettings, OptimConfig, OptimSettings
from meshrl.config.env import EnvConfig, EnvSettings
from meshrl.config.losses import DPOParams, PolicyLossSettings, PPOParams, RolloutISSettings, SFTParams, ValueParams
from meshrl.config.reward import RewardConfig
from meshrl.config.rollout import RolloutConfig, RolloutSettings
from orchestrator import config as run_config

# service setting -> how the run sets it, where not by the same name in the section
SET_ELSEWHERE = {
    (EngineConfig, "seed"): "trainer.seed",
    (OptimConfig, "total_steps"): "trainer.total_steps (the schedule advances once per step)",
    (OptimConfig, "betas"): "AdamW's defaults (not a run setting)",
    (RolloutConfig, "model"): "actor.model (the rollout serves the policy)",
    (RolloutConfig, "seed"): "trainer.seed",
    (RolloutConfig, "cpus"): "rollout.replicas (each replica of a CPU fleet its share of the cores)",
    (EnvConfig, "max_episodes"): "service-only: a limit of the service's own",
    (EnvConfig, "idle_timeout"): "service-only",
    (EnvConfig, "max_action_chars"): "service-only",
}
# service config -> (the settings class the run's section is made of, the section)
SECTIONS = [
    (EngineConfig, EngineSettings, run_config.ActorSection),
    (OptimConfig, OptimSettings, run_config.ActorSection),
    (RolloutConfig, RolloutSettings, run_config.RolloutSection),
    (RewardConfig, RewardConfig, run_config.RewardSection),
    (EnvConfig, EnvSettings, run_config.EnvSection),
    (PPOParams, PolicyLossSettings, run_config.ActorSection),
    (PPOParams, RolloutISSettings, run_config.AlgorithmSection),
]


def default(field: dataclasses.Field):
    return field.default if field.default is not dataclasses.MISSING else field.default_factory()


@pytest.mark.parametrize("service, settings, section", SECTIONS[:5], ids=lambda c: c.__name__)
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
    assert (ppo.clip_ratio_high, ppo.rollout_is, ppo.epochs) == (0.28, "token", 2)
    assert {f.name for f in dataclasses.fields(PPOParams)} - set(ppo_params(cfg)) == {"shuffle", "seed"}
    ValueParams(**value_params(cfg)), DPOParams(**dpo_params(cfg)), SFTParams(**sft_params(cfg))
