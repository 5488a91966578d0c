"""orchestrator.run.recovery's decisions, around fake services: what counts as lost, what is started again,
waited for or reloaded, and where the run goes on from. The real services' side of it is tested in
tests/e2e/test_chaos.py."""

import grpc
import pytest
import torch

from meshrl.errors import ServiceError
from meshrl.v1 import actor_pb2, common_pb2
from orchestrator.config import load_config
from orchestrator.lifecycle.mesh import Mesh
from orchestrator.run import recovery
from orchestrator.run.recovery import StepFailed, recover
from orchestrator.run.state import RunState


class FakeClient:
    def __init__(self, name, answering=True, version=0, partial="", torn=False):
        self.name, self.address, self.answering = name, f"127.0.0.1:{hash(name) % 1000 + 1000}", answering
        self.version, self.partial, self.torn, self.calls = version, partial, torn, []

    def health(self, timeout=5.0):
        if not self.answering:
            raise ServiceError(self.address, "Check", grpc.StatusCode.UNAVAILABLE, "down")
        return "SERVING"

    def wait_ready(self, timeout):
        self.calls.append("wait_ready")

    def call(self, method, request=None, timeout=None):
        self.calls.append(method)
        if method == "Describe":
            return common_pb2.ServiceInfo(
                weight_version=self.version, details={"partial": self.partial, "torn": str(self.torn).lower()}
            )
        if method == "PushWeights":
            return actor_pb2.PushWeightsResponse()
        return type("Reply", (), {"seconds": 0.0, "failed": []})()

    def describe(self, timeout=None):  # Client's typed calls: recorded as call() records them
        return self.call("Describe", timeout=timeout)

    def call_message(self, method, request, reply, timeout=None):
        return self.call(method, request, timeout)


class FakeServices:
    def __init__(self, ours, dead=()):
        self.ours, self._dead, self.restarted = {n: None for n in ours}, set(dead), set()

    def dead(self):
        return set(self._dead)

    def restart(self, names):
        self.restarted |= names
        return {n: FakeClient(n) for n in names}


class FakeAlgorithm:
    trained = ("actor",)

    def __init__(self):
        self.state = "now"

    def state_dict(self):
        return {"state": self.state}

    def load_state_dict(self, state):
        self.state = state["state"]


class FakeSampler(FakeAlgorithm):
    pass


class FakeLog:
    def __init__(self):
        self.forgot = None

    def forget_after(self, step):
        self.forgot = step


def setup(clients, ours, dead=(), checkpoint=0, monkeypatch=None, tmp_path=None):
    cfg = load_config(None, [f"trainer.run_dir={tmp_path}"])
    mesh, services = Mesh(cfg, clients), FakeServices(ours, dead)
    monkeypatch.setattr(recovery, "resume", lambda run_dir, mesh, algorithm, sampler, partial=None: checkpoint)
    return mesh, services


def go(mesh, services, algorithm=None, log=None, restarts=1):
    start = {"sampler": {"state": "start"}, "algorithm": {"state": "start"}, "rng": torch.get_rng_state()}
    state = RunState(
        mesh.cfg,
        services,
        mesh,
        algorithm or FakeAlgorithm(),
        None,
        None,
        FakeSampler(),
        number=7,
        batch=("batch",),
        restarts=restarts,
        log=log or FakeLog(),
        start=start,
    )
    return recover(StepFailed("step 7 failed: boom"), state)


def test_a_failure_that_lost_nothing_is_raised(monkeypatch, tmp_path):
    mesh, services = setup(
        {n: FakeClient(n) for n in ("actor", "rollout", "reward")},
        ["actor", "rollout", "reward"],
        monkeypatch=monkeypatch,
        tmp_path=tmp_path,
    )
    with pytest.raises(StepFailed, match="boom"):
        go(mesh, services)
    with pytest.raises(StepFailed, match="boom"):  # restarts spent
        go(mesh, FakeServices(["actor"], dead=["actor"]), restarts=4)


def test_a_dead_rollout_costs_its_step_and_gets_the_weights(monkeypatch, tmp_path):
    clients = {n: FakeClient(n) for n in ("actor", "rollout", "reward")}
    mesh, services = setup(
        clients, ["actor", "rollout", "reward"], dead=["rollout"], monkeypatch=monkeypatch, tmp_path=tmp_path
    )
    assert go(mesh, services) == (7, ("batch",))
    assert services.restarted == {"rollout"} and "PushWeights" in clients["actor"].calls


def test_a_rollout_left_with_half_a_weight_update_gets_the_weights_again(monkeypatch, tmp_path):
    """A bucketed push that broke off (a network error, say) leaves a given rollout refusing to generate:
    it is not restarted, only pushed the actor's weights, and the step is done again."""
    clients = {
        "actor": FakeClient("actor"),
        "rollout": FakeClient("rollout", torn=True),
        "reward": FakeClient("reward"),
    }
    mesh, services = setup(clients, ["actor", "reward"], monkeypatch=monkeypatch, tmp_path=tmp_path)
    assert go(mesh, services) == (7, ("batch",))
    assert services.restarted == set() and "PushWeights" in clients["actor"].calls


def test_an_actor_stopped_between_steps_takes_the_run_to_its_checkpoint(monkeypatch, tmp_path):
    """Alive but holding half an update (its Update's deadline passed): started afresh with our rollout
    (which takes no weights older than its own), and the run goes on after checkpoint 5; the reward
    service holds nothing of the run and is left alone."""
    clients = {
        "actor": FakeClient("actor", partial="update step 7 was stopped after 1 of 4 optimizer steps"),
        "rollout": FakeClient("rollout"),
        "reward": FakeClient("reward"),
    }
    mesh, services = setup(
        clients, ["actor", "rollout", "reward"], checkpoint=5, monkeypatch=monkeypatch, tmp_path=tmp_path
    )
    log = FakeLog()
    assert go(mesh, services, log=log) == (6, None)
    assert services.restarted == {"actor", "rollout"} and log.forgot == 5


def test_a_given_actor_that_comes_back_fresh_restarts_the_run(monkeypatch, tmp_path):
    """No checkpoint yet: the given actor came back with its base weights, ours start afresh, and the run
    goes back to its start (data order, algorithm state)."""
    clients = {
        "actor": FakeClient("actor", answering=False),
        "rollout": FakeClient("rollout"),
        "reward": FakeClient("reward"),
    }
    mesh, services = setup(clients, ["rollout", "reward"], monkeypatch=monkeypatch, tmp_path=tmp_path)
    algorithm = FakeAlgorithm()
    assert go(mesh, services, algorithm) == (1, None)
    assert clients["actor"].calls[0] == "wait_ready" and services.restarted == {"rollout"}
    assert algorithm.state == "start"


def test_trained_weights_with_no_checkpoint_to_go_back_to_are_an_error(monkeypatch, tmp_path):
    """A given actor stopped between steps, every service given: nothing can take it back to the start."""
    clients = {
        "actor": FakeClient("actor", version=7, partial="stopped"),
        "rollout": FakeClient("rollout", version=6),
        "reward": FakeClient("reward"),
    }
    mesh, services = setup(clients, [], monkeypatch=monkeypatch, tmp_path=tmp_path)
    with pytest.raises(StepFailed, match="actor, rollout .* no checkpoint to go back to: set trainer.save_every"):
        go(mesh, services)


class AheadClient(FakeClient):
    def __init__(self, name, version=0, last_step=0):
        super().__init__(name, version=version)
        self.last_step = last_step

    def call(self, method, request=None, timeout=None):
        return common_pb2.ServiceInfo(weight_version=self.version, details={"last_step": str(self.last_step)})


def test_a_service_ahead_of_the_run_stops_it_at_the_start_with_the_fix(tmp_path):
    """An actor that applied step 10000 (another run, or a stranger's Update) or a rollout at version
    2^53-1 would refuse every update or push of this run one by one: one line at the start instead."""
    cfg = load_config(None, [f"trainer.run_dir={tmp_path}"])
    fine = Mesh(cfg, {"actor": AheadClient("actor", last_step=5), "rollout": AheadClient("rollout", version=5)})
    recovery.check_not_ahead(fine, ("actor",), 5)  # a resumed run at its checkpoint
    ahead = Mesh(cfg, {"actor": AheadClient("actor", last_step=10000), "rollout": AheadClient("rollout", 2**53 - 1)})
    with pytest.raises(
        ValueError,
        match=r"actor at .* holds step 10000; rollout at .* holds weight version "
        r"9007199254740991, ahead of this run \(at step 0\).*Restart it",
    ):
        recovery.check_not_ahead(ahead, ("actor",), 0)
