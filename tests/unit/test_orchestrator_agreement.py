"""Services given by address are compared with the run's config (orchestrator.lifecycle.agreement): the settings
the services report are the ones their flags set, a difference stops the run naming both values, and
trainer.given_settings=adopt takes the service's values instead."""

import json

import grpc
import pytest
from service_flags import parsed

from meshrl.config.actor import EngineConfig, OptimConfig
from meshrl.config.reward import RewardConfig
from meshrl.config.rollout import RolloutConfig
from meshrl.errors import ServiceError
from meshrl.flags import settings_json
from meshrl.v1 import common_pb2
from orchestrator.config import load_config
from orchestrator.lifecycle.agreement import agree, same_tokenizer
from orchestrator.lifecycle.mesh import Mesh
from orchestrator.lifecycle.roles import serve_args


class Reporting:
    def __init__(self, settings: str | None, address="10.0.0.2:50051"):
        self.settings, self.address = settings, address

    def call(self, method, request=None, timeout=None):
        if self.settings is None:
            raise ServiceError(self.address, method, grpc.StatusCode.UNIMPLEMENTED, "no Describe")
        return common_pb2.ServiceInfo(details={"settings": self.settings})

    def describe(self, timeout=None):
        return self.call("Describe", timeout=timeout)


def started_from(cfg, role: str) -> str:
    """What a service started with serve_args(cfg, role) reports: its flags parsed back, defaults filled."""
    args = serve_args(cfg, role)
    if role == "rollout":
        return settings_json(parsed(RolloutConfig, args))
    if role == "reward":
        return settings_json(parsed(RewardConfig, args))
    return settings_json(parsed(EngineConfig, args), parsed(OptimConfig, args, skip=("betas",)))


BASE = [
    "actor.model=m",
    "data.train_files=t",
    "actor.lr=5e-5",
    "actor.micro_batch_tokens=4096",
    "rollout.backend=hf",
    "trainer.total_steps=80",
]


def test_services_started_from_the_config_agree_with_it():
    cfg = load_config(None, BASE)
    mesh = Mesh(cfg, {r: Reporting(started_from(cfg, r)) for r in ("actor", "rollout", "reward")})
    assert agree(cfg, mesh, {"actor", "rollout", "reward"}) is False


def test_a_difference_stops_the_run_naming_the_key_and_both_values():
    """docker-compose.yml's actor ran at lr 1e-4 with 64-row micro-batches and its rollout on vLLM while the
    config it loads said 5e-5, 4096-token micro-batches and hf."""
    cfg = load_config(None, BASE)
    other = load_config(None, [*BASE, "actor.lr=1e-4", "actor.micro_batch_tokens=0", "rollout.backend=vllm"])
    mesh = Mesh(
        cfg,
        {
            "actor": Reporting(started_from(other, "actor")),
            "rollout": Reporting(started_from(other, "rollout"), "10.0.0.3:50053"),
        },
    )
    with pytest.raises(ValueError) as e:
        agree(cfg, mesh, {"actor", "rollout"})
    text = str(e.value)
    assert "actor at 10.0.0.2:50051 has lr=0.0001, the config actor.lr=5e-05" in text
    assert "micro_batch_tokens=0, the config actor.micro_batch_tokens=4096" in text
    assert "rollout at 10.0.0.3:50053 has backend='vllm', the config rollout.backend='hf'" in text
    assert "trainer.given_settings=adopt" in text and "\n" not in text


def test_adopt_takes_the_services_values_and_unreported_settings_are_not_compared(tmp_path):
    cfg = load_config(None, [*BASE, "trainer.given_settings=adopt"])
    other = load_config(None, [*BASE, "actor.lr=1e-4", "rollout.dtype=bfloat16"])
    mesh = Mesh(
        cfg,
        {
            "actor": Reporting(started_from(other, "actor")),
            "rollout": Reporting(started_from(other, "rollout")),
            "reward": Reporting(None),
        },
    )
    assert agree(cfg, mesh, {"actor", "rollout", "reward"}) is True
    assert cfg.actor.lr == 1e-4 and cfg.rollout.dtype == "bfloat16"
    placed = load_config(None, [*BASE, "actor.world_size=2", "rollout.kv_cache_gb=4"])  # a service's own business
    assert json.loads(started_from(placed, "rollout"))["kv_cache_gb"] == 4
    fresh = load_config(None, BASE)
    assert agree(fresh, Mesh(fresh, {"rollout": Reporting(started_from(placed, "rollout"))}), {"rollout"}) is False


class Fingerprinted:
    def __init__(self, tokenizer: str, address="10.0.0.3:50051"):
        self.tokenizer, self.address = tokenizer, address

    def describe(self, timeout=None):
        return common_pb2.ServiceInfo(details={"tokenizer": self.tokenizer} if self.tokenizer else {})


def test_a_teacher_given_by_address_with_another_tokenizer_stops_the_run():
    cfg = load_config(None, ["teacher.address=10.0.0.3:50051"])
    same = Mesh(cfg, {"actor": Fingerprinted("abc"), "teacher": Fingerprinted("abc")})
    same_tokenizer(same)
    other = Mesh(cfg, {"actor": Fingerprinted("abc"), "teacher": Fingerprinted("def")})
    with pytest.raises(ValueError, match=r"the teacher at 10.0.0.3:50051 has another tokenizer than the actor's"):
        same_tokenizer(other)
    same_tokenizer(Mesh(cfg, {"actor": Fingerprinted("abc"), "teacher": Fingerprinted("")}))  # another make


def test_the_teacher_is_served_frozen_from_its_own_folder():
    cfg = load_config(None, ["actor.model=student", "teacher.model=teacher", "teacher.world_size=2"])
    args = serve_args(cfg, "teacher")
    assert args[:5] == ["actor", "--role", "ref", "--model", "teacher"] and "--lr" not in args
    assert args[args.index("--world-size") + 1] == "2" and args[args.index("--lora-rank") + 1] == "0"
