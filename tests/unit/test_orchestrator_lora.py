"""How a run wires a LoRA actor (issue 30): the ref is the actor's base model (no ref service), the rollout
the run starts takes the adapter, the critic has its own rank, and given services are held to it."""

import json

from service_flags import parsed  # the services' own flag parsing

from meshrl.config.actor import EngineConfig
from meshrl.config.rollout import RolloutConfig
from meshrl.flags import settings_json
from orchestrator.config import load_config
from orchestrator.lifecycle.agreement import differences
from orchestrator.lifecycle.mesh import Mesh
from orchestrator.lifecycle.roles import ref_in_actor, serve_args, settings, wanted
from orchestrator.loops.policy_gradient import grpo, ppo

BASE = ["actor.model=m", "data.train_files=t", "actor.use_kl_loss=true"]


def test_a_lora_actor_serves_the_ref_and_no_ref_service_starts():
    cfg = load_config(None, [*BASE, "actor.lora_rank=8"])
    roles = grpo().setup(cfg)
    assert "ref" in roles and ref_in_actor(cfg) and "ref" not in wanted(cfg, roles)
    mesh = Mesh(cfg, {})
    assert mesh.has("ref") and mesh.ref_in_actor
    given = load_config(None, [*BASE, "actor.lora_rank=8", "ref.address=host:1"])  # a ref service of the user's
    assert "ref" in wanted(given, grpo().setup(given)) and not Mesh(given, {}).has("ref")
    plain = load_config(None, BASE)
    assert "ref" in wanted(plain, grpo().setup(plain))


def test_the_rollout_takes_the_adapter_unless_it_is_merged():
    cfg = load_config(None, [*BASE, "actor.lora_rank=16"])
    assert parsed(RolloutConfig, serve_args(cfg, "rollout")).max_lora_rank == 16
    merged = load_config(None, [*BASE, "actor.lora_rank=16", "rollout.merge_lora=true"])
    assert parsed(RolloutConfig, serve_args(merged, "rollout")).max_lora_rank == 0
    assert parsed(EngineConfig, serve_args(cfg, "actor")).lora_rank == 16
    assert parsed(EngineConfig, serve_args(cfg, "ref")).lora_rank == 0  # the ref is the base model


def test_the_critic_has_its_own_rank():
    cfg = load_config(None, [*BASE, "actor.lora_rank=8", "critic.lora_rank=4"])
    assert settings(cfg, "critic")["lora_rank"] == 4
    full = load_config(None, [*BASE, "actor.lora_rank=8"])
    assert settings(full, "critic")["lora_rank"] == 0 and "critic" in ppo().setup(full)


def test_a_given_rollout_must_take_adapters_of_the_actors_rank():
    cfg = load_config(None, [*BASE, "actor.lora_rank=8"])

    def theirs(rank: int) -> dict:
        return json.loads(settings_json(RolloutConfig(model="m", max_lora_rank=rank)))

    assert differences(cfg, "rollout", theirs(0)) == [("rollout.max_lora_rank", 8, 0)]
    assert differences(cfg, "rollout", theirs(64)) == []  # more room than the adapter needs is fine
