"""A hung rollout replica (SIGSTOP: up, answering nothing) costs its call a deadline scaled from the work,
not the step: the call goes to the other replica, which samples the same prompts with the same seeds, and
the hung one is set aside (lifecycle.fleet.Router.deadline, Mesh._serve). Two real `meshrl serve rollout`
processes (HF backend) on 127.0.0.1."""

import logging
import signal

import psutil
import torch

from meshrl.dataproto import DataProto
from orchestrator.config import load_config
from orchestrator.lifecycle import fleet
from orchestrator.lifecycle.mesh import Mesh
from orchestrator.lifecycle.roles import serve_args
from orchestrator.lifecycle.services import Services


def prompts(tokenizer_ids: list[list[int]]) -> DataProto:
    ids = torch.tensor(tokenizer_ids)
    return DataProto({"input_ids": ids, "attention_mask": torch.ones_like(ids)})


def test_a_hung_replica_is_set_aside_and_its_call_served_by_another(tiny_lm, caplog, monkeypatch):
    monkeypatch.setattr(fleet, "MIN_DEADLINE", 2.0)  # the test waits out one deadline: keep it short
    monkeypatch.setattr(fleet, "SLACK", 3.0)
    cfg = load_config(
        None,
        [
            f"actor.model={tiny_lm}",
            "rollout.backend=hf",
            "rollout.replicas=2",
            "rollout.n=2",
            "rollout.max_new_tokens=6",
        ],
    )
    services = Services()
    try:
        args = serve_args(cfg, "rollout")
        clients = services.start_all({"rollout": ("", args), "rollout-1": ("", args)}, timeout=120)
        mesh = Mesh(cfg, dict(clients))
        batch = prompts([[5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16], [17, 18, 19, 20]])
        mesh.generate(batch, seed=3)  # both replicas serve a part, and warm up (not timed)
        first = mesh.generate(batch, seed=11)  # the fleet's pace is timed
        deadline = mesh.router.deadline(8)
        assert deadline is not None and deadline >= 2.0
        hung = psutil.Process(services.ours["rollout-1"][0].pid)
        hung.suspend()
        with caplog.at_level(logging.WARNING, logger="orchestrator.lifecycle.mesh"):
            again = mesh.generate(batch, seed=11)
        assert mesh.router.down == {"rollout-1"}
        assert f"rollout replica rollout-1 ({clients['rollout-1'].address}) gave no answer in" in caplog.text
        assert torch.equal(again.batch["responses"], first.batch["responses"])  # the same samples, by seed
        assert mesh.router.deadline(8) is None  # one replica up: the client's own deadline again
        hung.resume()
    finally:
        for proc, _ in services.ours.values():
            proc.send_signal(signal.SIGCONT)
        services.stop()
