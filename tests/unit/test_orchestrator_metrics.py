"""The step's rollout figures (orchestrator.loops.policy_gradient): response_length/clip_ratio counts the
responses cut off by the generation limit, not those as long as the batch's longest."""

from meshrl.dataproto import DataProto
from meshrl.layout import rollout_tensors
from orchestrator.config import load_config
from orchestrator.loops.policy_gradient import clip_ratio, response_limit


def generated(lengths: list[int], finish: list[str] | None = None) -> DataProto:
    tensors = rollout_tensors([[1, 2]] * len(lengths), [[5] * n for n in lengths], pad=0)
    return DataProto(tensors, {"finish_reason": finish} if finish is not None else {})


def test_short_responses_are_not_clipped():
    # every response 3 tokens under a limit of 8: the batch's longest is 3, yet none was cut off
    assert clip_ratio(generated([3, 3, 2, 1]), limit=8) == 0.0


def test_responses_at_the_limit_are_clipped():
    assert clip_ratio(generated([8, 3, 8, 1]), limit=8) == 0.5


def test_a_response_that_ended_at_the_limit_is_not_clipped():
    # the model's end token as the limit's last token: it finished, it was not cut off
    assert clip_ratio(generated([8, 8, 3, 2], ["stop", "length", "stop", "stop"]), limit=8) == 0.25


def test_the_limit_is_the_runs():
    assert response_limit(load_config(None, ["rollout.max_new_tokens=8"])) == 8
    multi = ["rollout.multi_turn=true", "rollout.max_new_tokens=8", "rollout.max_turns=3"]
    assert response_limit(load_config(None, multi)) == 24
    assert response_limit(load_config(None, [*multi, "rollout.max_response_tokens=20"])) == 20
