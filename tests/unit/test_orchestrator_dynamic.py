"""algorithm.dynamic_sampling (orchestrator.sampling.dynamic): which groups a step keeps over its rounds, with
rounds of hand-made samples in place of the rollout (the real mesh runs it in tests/e2e/test_loops.py)."""

import types

import numpy as np
import torch

from meshrl.clients.reward import Scores
from meshrl.dataproto import DataProto
from orchestrator.config import load_config
from orchestrator.lifecycle.mesh import Mesh
from orchestrator.sampling import dynamic
from orchestrator.sampling.dynamic import Dynamic
from orchestrator.sampling.rollouts import Now, Rollouts
from orchestrator.timer import Timer

N = 2  # samples per prompt


def round_of(groups: dict[str, list[float]]) -> tuple[DataProto, Scores]:
    uids = [u for u, scores in groups.items() for _ in scores]
    b = len(uids)
    prompts, responses = torch.full((b, 2), 5), torch.arange(b * 3).reshape(b, 3)
    gen = DataProto(
        {
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], 1),
            "attention_mask": torch.ones(b, 5, dtype=torch.long),
            "position_ids": torch.arange(5).repeat(b, 1),
            "response_mask": torch.ones(b, 3),
        },
        {"uid": np.array(uids, dtype=object)},
        {"weight_version": 1},
    )
    scores = torch.tensor([s for scores in groups.values() for s in scores])
    columns = {"acc": np.array([s > 0 for s in scores.tolist()], dtype=object)}
    return gen, Scores(scores, torch.zeros(b, 3), columns, {"reward/num_failed": 0.0})


class Rounds(Now):
    """The step's first round is `first`; each further round the next of `later`."""

    def __init__(self, first: dict, later: list[dict]):
        self.rounds, self.asked = [first, *later], list[int]()

    def sample(self, mesh, number, indices, uids, more, round=0):
        if round:
            self.asked.append(round)
        return *round_of(self.rounds.pop(0)), {}, {}


def fill(later, first, groups=2, rounds=8, metric="acc"):
    cfg = load_config(
        None,
        [
            "algorithm.dynamic_sampling=true",
            f"algorithm.max_sample_rounds={rounds}",
            f"algorithm.dynamic_sampling_metric={metric}",
        ],
    )
    now = Rounds(first, later)
    rollouts = Rollouts(Mesh(cfg, {}), None, Dynamic(now), more=lambda: ([0], ["x"]))
    gen, scored = rollouts.sample_and_score(Timer(), 3, list(range(groups)), [f"u{i}" for i in range(groups)])
    return gen, scored, rollouts.metrics, types.SimpleNamespace(asked=now.asked, sampled=rollouts.sampled)


def test_rounds_until_the_batch_is_full_and_the_surplus_is_left_out():
    first = {"a": [1, 1], "b": [0, 1]}  # a: all right (dropped), b varies
    later = [{"c": [0, 0], "d": [0, 0]}, {"e": [1, 0], "f": [0, 1]}]  # none varies; then two do, one is needed
    gen, scored, metrics, rollouts = fill(later, first)
    assert list(gen.non_tensor_batch["uid"]) == ["b", "b", "e", "e"] and rollouts.asked == [1, 2]
    assert scored.scores.tolist() == [0, 1, 1, 0] and list(scored.columns["acc"]) == [False, True, True, False]
    assert metrics == {
        "dynamic_sampling/rounds": 3.0,
        "dynamic_sampling/kept_groups": 2.0,
        "dynamic_sampling/dropped_groups": 3.0,
        "dynamic_sampling/samples_per_kept": 12 / 4,
    }
    assert rollouts.sampled[0] is gen  # the sample log shows what was trained on


def test_a_step_out_of_rounds_trains_on_what_it_kept_or_on_its_last_round():
    gen, _, metrics, _ = fill([{"c": [1, 0]}], {"a": [1, 1], "b": [0, 0]}, rounds=2, groups=3)
    assert list(gen.non_tensor_batch["uid"]) == ["c", "c"] and metrics["dynamic_sampling/kept_groups"] == 1
    gen, _, metrics, _ = fill([{"c": [0, 0]}], {"a": [1, 1]}, rounds=2)
    assert list(gen.non_tensor_batch["uid"]) == ["c", "c"] and metrics["dynamic_sampling/kept_groups"] == 0


def test_score_is_a_metric_too_and_acc_must_be_reported():
    gen, _, _, _ = fill([], {"a": [0.5, 0.7], "b": [1, 1]}, groups=1, metric="score")  # acc would see a as all right
    assert list(gen.non_tensor_batch["uid"]) == ["a", "a"]
    gen, scored = round_of({"a": [0, 1]})
    scored.columns.clear()
    try:
        dynamic.values(scored, "acc")
    except ValueError as e:
        assert "reports no acc: set it to score" in str(e)
    else:
        raise AssertionError("no error for a missing acc")
