"""The rollout fleet's routing (lifecycle.fleet, Mesh): which replica serves which prompts with which seed,
what a lost replica costs, and what one push names (recording clients in place of the services; the real
fleet runs in tests/e2e/test_fleet.py)."""

import os
import threading

import grpc
import pytest
import torch

from meshrl import hosts
from meshrl.dataproto import DataProto
from meshrl.errors import ServiceError
from meshrl.v1 import actor_pb2
from orchestrator.config import load_config
from orchestrator.lifecycle.fleet import MIN_DEADLINE, SLACK, NoReplica, Router, replica_names, starts
from orchestrator.lifecycle.mesh import Mesh
from orchestrator.lifecycle.roles import wanted


class Replica:
    """A rollout that answers Generate with one token per sample (its prompt's first id) and records calls."""

    def __init__(self, name: str, fail: ServiceError | None = None):
        self.name, self.address, self.fail = name, f"127.0.0.{len(name)}:{1000 + sum(map(ord, name))}", fail
        self.calls: list[tuple[list[int], int | None]] = []  # (prompt first ids, seed)
        self.lock = threading.Lock()

    def call_batch(self, method, request, reply, **kw):
        assert method == "Generate"
        if self.fail is not None:
            raise self.fail
        ids = request.data.batch["input_ids"]
        seed = request.msg.sampling.seed if request.msg.sampling.HasField("seed") else None
        with self.lock:
            self.calls.append((ids[:, -1].tolist(), seed))
        n = request.msg.sampling.n
        rows = ids.repeat_interleave(n, 0)
        one = torch.ones(len(rows), 1, dtype=torch.long)
        gen = DataProto(
            {
                "prompts": rows,
                "responses": rows[:, -1:],
                "input_ids": torch.cat([rows, rows[:, -1:]], 1),
                "attention_mask": torch.cat([torch.ones_like(rows), one], 1),
                "position_ids": torch.arange(rows.shape[1] + 1).repeat(len(rows), 1),
                "response_mask": one.float(),
            },
            meta_info={"weight_version": 0},
        )
        return None, gen


class Actor:
    def __init__(self, failed=()):
        self.requests: list[actor_pb2.PushWeightsRequest] = []
        self.failed = list(failed)
        self.address = "127.0.0.1:9"

    def call_message(self, method, request, reply, **kw):
        self.requests.append(request)
        failed, self.failed = self.failed, []  # once: a replica refuses a push, then takes the next
        return actor_pb2.PushWeightsResponse(
            version=request.version, seconds=0.5, failed=failed, delta=request.delta, sent_bytes=10, num_bytes=100
        )


def fleet(replicas: int, fail: dict | None = None, overrides=()):
    cfg = load_config(None, [f"rollout.replicas={replicas}", "rollout.n=2", *overrides])
    clients = {name: Replica(name, (fail or {}).get(name)) for name in replica_names(cfg)}
    return Mesh(cfg, {"actor": Actor(), **clients}), clients


def prompts(k: int) -> DataProto:
    ids = torch.arange(10, 10 + k).unsqueeze(1)
    return DataProto({"input_ids": ids, "attention_mask": torch.ones_like(ids)})


def test_a_call_is_cut_into_a_consecutive_part_per_replica_each_with_its_own_seed():
    mesh, replicas = fleet(3)
    gen = mesh.generate(prompts(7), seed=100)
    assert starts(7, 3) == [0, 2, 4]
    assert replicas["rollout"].calls == [([10, 11], 100)]
    assert replicas["rollout-1"].calls == [([12, 13], 102)]
    assert replicas["rollout-2"].calls == [([14, 15, 16], 104)]
    assert gen.batch["responses"][:, 0].tolist() == [p for p in range(10, 17) for _ in range(2)]  # in order
    assert mesh.router.in_flight == {"rollout": 0, "rollout-1": 0, "rollout-2": 0}


def test_one_replica_takes_the_call_whole():
    mesh, replicas = fleet(1)
    mesh.generate(prompts(5), seed=3)
    assert replicas["rollout"].calls == [([10, 11, 12, 13, 14], 3)]


def test_a_lost_replica_is_set_aside_and_its_part_served_by_another():
    lost = ServiceError(
        "127.0.0.1:1", "/meshrl.v1.RolloutService/Generate", grpc.StatusCode.UNAVAILABLE, "connection refused"
    )
    mesh, replicas = fleet(2, {"rollout-1": lost})
    gen = mesh.generate(prompts(4), seed=7)
    assert sorted(replicas["rollout"].calls) == [([10, 11], 7), ([12, 13], 9)]  # the part keeps its seed
    assert len(gen) == 8 and mesh.router.down == {"rollout-1"}
    mesh.generate(prompts(2), seed=1)  # the cut stays the fleet's (the same seeds), all of it on the one up
    assert sorted(replicas["rollout"].calls[-2:]) == [([10], 1), ([11], 2)]


def test_a_request_error_is_the_requests_and_the_last_replica_fails_as_it_failed():
    bad = ServiceError(
        "127.0.0.1:1", "/meshrl.v1.RolloutService/Generate", grpc.StatusCode.INVALID_ARGUMENT, "too long"
    )
    mesh, _ = fleet(2, {"rollout": bad})
    with pytest.raises(ServiceError, match="too long"):
        mesh.generate(prompts(4), seed=0)
    assert not mesh.router.down  # the request's fault, not the replica's
    lost = ServiceError("127.0.0.1:1", "/meshrl.v1.RolloutService/Generate", grpc.StatusCode.UNAVAILABLE, "gone")
    mesh, _ = fleet(2, {"rollout": lost, "rollout-1": lost})
    with pytest.raises(ServiceError, match="gone"):
        mesh.generate(prompts(4), seed=0)
    mesh, _ = fleet(1, {"rollout": lost})
    with pytest.raises(ServiceError, match="gone"):  # one rollout: the step fails, recovery restarts it
        mesh.generate(prompts(4), seed=0)
    assert not mesh.router.down


def test_the_least_loaded_replica_is_picked_and_a_preferred_one_kept_while_up():
    router = Router(["rollout", "rollout-1", "rollout-2"])
    assert [router.pick(4) for _ in range(3)] == ["rollout", "rollout-1", "rollout-2"]
    router.done("rollout-1", 4, served=True)
    assert router.pick(1) == "rollout-1"
    assert router.pick(8, prefer="rollout-2") == "rollout-2"
    router.mark_down("rollout-2")
    assert router.pick(1, prefer="rollout-2") == "rollout-1"  # 1 in flight against rollout's 4
    for name in ("rollout", "rollout-1"):
        router.mark_down(name)
    with pytest.raises(NoReplica):
        router.pick(1)
    metrics = router.metrics({"rollout": 3})
    assert metrics["rollout/replica1/samples"] == 4 and metrics["rollout/replica0/weight_version"] == 3
    assert metrics["rollout/replicas_up"] == 0 and router.metrics({})["rollout/replica1/samples"] == 0


def test_one_push_names_every_replica_up_and_sets_aside_those_that_failed():
    mesh, replicas = fleet(3)
    actor = mesh["actor"]
    mesh.router.mark_down("rollout-2")
    mesh.push_weights(version=4)
    (request,) = actor.requests
    assert [request.rollout_address, *request.more_rollout_addresses] == [
        replicas["rollout"].address,
        replicas["rollout-1"].address,
    ]
    assert mesh.weight_version == 4
    actor.failed = [actor_pb2.PushFailure(address=replicas["rollout-1"].address, code="UNAVAILABLE", details="gone")]
    mesh.push_weights(version=5)
    assert mesh.router.down == {"rollout-1", "rollout-2"} and mesh.weight_version == 5
    mesh.push_weights(version=5, replicas=["rollout-2"])  # one brought back: only it
    assert actor.requests[-1].rollout_address == replicas["rollout-2"].address


def test_a_replica_that_refuses_a_delta_takes_the_full_weights_and_stays_up(caplog):
    """rollout.push=delta: ABORTED (no base of the version before) and DATA_LOSS (its base failed the
    checksum) are mended by a second push of the same version to that replica alone, which the actor sends
    whole; any other failure sets the replica aside as before. auto: full over shm."""
    mesh, replicas = fleet(3, overrides=["rollout.push=delta"])
    actor = mesh["actor"]
    one, two = replicas["rollout-1"].address, replicas["rollout-2"].address
    actor.failed = [
        actor_pb2.PushFailure(address=one, code="ABORTED", details="holds no base"),
        actor_pb2.PushFailure(address=two, code="DATA_LOSS", details="checksum mismatch"),
    ]
    mesh.push_weights(version=3)
    first, again = actor.requests
    assert first.delta and again.delta and again.version == 3
    assert [again.rollout_address, *again.more_rollout_addresses] == [one, two]
    assert not mesh.router.down and mesh.weight_version == 3
    assert "rollout-2 takes weight version 3 whole: checksum mismatch" in caplog.text
    assert mesh.last_push == {"push/sent_mb": 20 / 2**20, "push/weights_mb": 100 / 2**20, "push/delta": 1.0}
    actor.failed = [actor_pb2.PushFailure(address=one, code="UNAVAILABLE", details="gone")]
    mesh.push_weights(version=4)
    assert len(actor.requests) == 3 and mesh.router.down == {"rollout-1"}
    mesh, _ = fleet(1)
    mesh.push_weights(version=1)
    assert not mesh["actor"].requests[0].delta  # auto over shm: full


def test_a_replica_that_fails_its_full_push_too_is_set_aside_and_the_push_stands():
    mesh, replicas = fleet(2, overrides=["rollout.push=delta"])
    actor, one = mesh["actor"], replicas["rollout-1"].address
    actor.failed = [actor_pb2.PushFailure(address=one, code="ABORTED", details="holds no base")]
    answer = actor.call_message

    def call_message(method, request, reply, **kw):
        if request.rollout_address == one:  # the full push to it alone: every replica of it failed
            raise ServiceError(one, "PushWeights", grpc.StatusCode.UNAVAILABLE, "gone")
        return answer(method, request, reply, **kw)

    actor.call_message = call_message
    mesh.push_weights(version=2)
    assert mesh.router.down == {"rollout-1"} and mesh.weight_version == 2


def test_the_run_starts_a_service_per_replica_or_uses_the_listed_ones(monkeypatch):
    cfg = load_config(None, ["rollout.replicas=3"])
    monkeypatch.setattr(hosts, "gpus", lambda: 0)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5}, raising=False)
    started = wanted(cfg, {"actor", "rollout", "reward"})
    assert [k for k in started if k.startswith("rollout")] == ["rollout", "rollout-1", "rollout-2"]
    # on CPU each replica gets its share of the cores; otherwise the same settings
    assert [started[k][1][-2:] for k in ("rollout", "rollout-1", "rollout-2")] == [
        ["--cpus", "0,1"],
        ["--cpus", "2,3"],
        ["--cpus", "4,5"],
    ]
    assert started["rollout-2"][0] == "" and started["rollout-2"][1][:-2] == started["rollout"][1][:-2]
    assert hosts.share_cores(3)[2] == "4,5" and hosts.parse_cpus("4-5,0") == [0, 4, 5]
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert hosts.share_cores(3) == ["0", "1", "0"]  # more replicas than cores: one core each, shared
    with pytest.raises(ValueError, match="must be core ids"):
        hosts.parse_cpus("0-x")
    cfg = load_config(None, ["rollout.address=127.0.0.2:5000,127.0.0.3:5000"])
    given = wanted(cfg, {"actor", "rollout", "reward"})
    assert given["rollout"][0] == "127.0.0.2:5000" and given["rollout-1"][0] == "127.0.0.3:5000"
    with pytest.raises(ValueError, match="lists 2 replicas and rollout.replicas=3"):
        load_config(None, ["rollout.address=127.0.0.2:5000,127.0.0.3:5000", "rollout.replicas=3"])


def test_meshrl_fleet_writes_what_the_run_reads(tmp_path, capsys):
    from cli.main import main
    from orchestrator.lifecycle.fleet import read_fleet

    assert main(["fleet", str(tmp_path), "--replicas", "3"]) == 2  # not a run folder
    assert "no config.yaml" in capsys.readouterr().err
    (tmp_path / "config.yaml").write_text("{}\n")
    assert main(["fleet", str(tmp_path), "--replicas", "3"]) == 0
    assert read_fleet(tmp_path) == {"replicas": 3}
    assert main(["fleet", str(tmp_path), "--address", "127.0.0.2:5000, 127.0.0.3:5000"]) == 0
    assert read_fleet(tmp_path) == {"address": "127.0.0.2:5000,127.0.0.3:5000"}
    assert main(["fleet", str(tmp_path), "--replicas", "-1"]) == 2
    assert read_fleet(tmp_path) == {"address": "127.0.0.2:5000,127.0.0.3:5000"}  # a refused change leaves it
    (tmp_path / "fleet.json").write_text("not json")
    assert read_fleet(tmp_path) is None


def test_a_removed_replica_gets_no_new_calls_and_its_calls_in_flight_finish():
    router = Router(["rollout", "rollout-1"])
    assert router.pick(2) == "rollout" and router.pick(2) == "rollout-1"
    done = threading.Timer(0.1, lambda: router.done("rollout-1", 2, served=True))
    done.start()
    assert router.remove("rollout-1", timeout=5)  # waited for the call in flight
    assert router.names == ["rollout"] and router.pick(1) == "rollout"
    router.add("rollout-2")
    assert router.pick(1) == "rollout"  # a new replica is set aside until it has the weights
    router.mark_up("rollout-2")
    assert router.pick(1) == "rollout-2"
    router.done("rollout-1", 2, served=True)  # a call of a removed replica ending late is ignored


def test_a_call_that_fails_otherwise_is_no_longer_counted_in_flight():
    mesh, replicas = fleet(2)
    replicas["rollout-1"].fail = RuntimeError("a reply that cannot be decoded")  # not the service's error
    with pytest.raises(RuntimeError, match="cannot be decoded"):
        mesh.generate(prompts(4), seed=0)
    assert mesh.router.in_flight == {"rollout": 0, "rollout-1": 0} and not mesh.router.down


def test_a_call_gets_a_deadline_from_the_fleets_pace_once_it_has_one():
    router = Router(["rollout", "rollout-1"])
    assert router.deadline(8) is None  # nothing timed yet: the client's own deadline
    router.timed("rollout", 5.0, 8)  # a replica's first call warms its engine up: not the pace
    assert router.deadline(8) is None
    router.timed("rollout", 0.8, 8)
    router.timed("rollout-1", 9.0, 8)  # rollout-1's first
    router.timed("rollout-1", 1.6, 8)
    assert router.deadline(100) == pytest.approx(SLACK * 0.2 * 100)  # the slowest recent pace, times SLACK
    assert router.deadline(1) == MIN_DEADLINE
    router.mark_down("rollout-1")
    assert router.deadline(100) is None  # no other replica to send the call to
