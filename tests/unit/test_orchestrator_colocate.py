"""rollout.colocate: the order of calls that hands one GPU between the rollout and the models that train
(recording clients in place of the services; the services' side is tested in tests/contract)."""

import types

from meshrl.dataproto import DataProto
from meshrl.v1 import actor_pb2
from orchestrator.config import load_config
from orchestrator.lifecycle.mesh import Mesh


class Recorder:
    def __init__(self, role: str, calls: list):
        self.role, self.calls, self.address = role, calls, f"{role}:1"

    def call(self, method, request=None, **kw):
        tags = list(getattr(request, "tags", []) or [])
        self.calls.append(f"{self.role}.{method}" + (f"({','.join(tags)})" if tags else ""))
        if method == "PushWeights":
            return actor_pb2.PushWeightsResponse()
        return types.SimpleNamespace(data=DataProto(), seconds=0.0, failed=[])

    def call_message(self, method, request, reply, **kw):  # Client's typed calls: the same record
        return self.call(method, request, **kw)

    def call_batch(self, method, request, reply, **kw):
        out = self.call(method, request, **kw)
        return out, out.data


def mesh(colocate: bool, roles=("actor", "ref", "rollout")):
    calls = []
    cfg = load_config(None, [f"rollout.colocate={str(colocate).lower()}"])
    return Mesh(cfg, {r: Recorder(r, calls) for r in roles}), calls


def test_colocated_generation_has_the_gpu_to_itself_and_gives_it_back():
    m, calls = mesh(True)
    m.generate(DataProto(), seed=1)
    assert calls == [
        "actor.Offload",
        "ref.Offload",
        "rollout.WakeUp",
        "rollout.Generate",
        "rollout.Sleep",
        "actor.Reload",
        "ref.Reload",
    ]
    calls.clear()
    m.push_weights(version=1)  # into the sleeping rollout: its weights wake, its KV cache stays freed
    assert calls == ["rollout.WakeUp(weights)", "actor.PushWeights"]


def test_a_failed_generation_leaves_the_models_where_they_are():
    m, calls = mesh(True, roles=("actor", "rollout"))

    def fail(method, request=None, **kw):
        calls.append(f"rollout.{method}")
        if method == "Generate":
            raise RuntimeError("the rollout died")

    m["rollout"].call = fail
    try:
        m.generate(DataProto())
    except RuntimeError:
        pass
    assert calls == ["actor.Offload", "rollout.WakeUp", "rollout.Generate"]  # no Sleep into a dead service


def test_without_colocate_generation_and_push_are_single_calls():
    m, calls = mesh(False)
    m.generate(DataProto())
    m.push_weights(version=1)
    assert calls == ["rollout.Generate", "actor.PushWeights"]
