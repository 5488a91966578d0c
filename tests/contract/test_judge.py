"""A judge in the mesh (orchestrator/judge): a real rollout service (hf, the tiny model) serving the
judge, and the project's own OpenAI-compatible endpoint (`meshrl serve gateway`) in front of it as a
judge.url. The step's judgements go in one Generate, the cache serves a repeated batch without a call,
a judge function asks through the same cache, and a URL judge says what the served judge says (both
greedy on the same model and template) with its key from the environment."""

import pytest
import torch
from calls import serve, served_gateway

from meshrl.clients import Scores
from meshrl.dataproto import DataProto, object_array
from orchestrator.judge.grading import Judge
from orchestrator.judge.settings import JudgeSection

RESPONSES = ["19", "18", "7", "19", "42", "0"]
FUNCTION = """
def judge(samples, ask):
    said = ask([s["prompt"] + s["response"] + "?" for s in samples])
    return [float(len(t) % 2) for t in said]
"""


def batch() -> tuple[DataProto, Scores]:
    n = len(RESPONSES)
    gen = DataProto(
        {"response_mask": torch.ones(n, 2, dtype=torch.long)},
        {
            "prompt": object_array([[{"role": "user", "content": "12+7="}]] * n),
            "response_text": object_array(RESPONSES),
            "data_source": object_array(["arithmetic"] * n),
            "uid": object_array(["g"] * 3 + ["h"] * 3),
            "reward_model": object_array([{"ground_truth": "19"}] * n),
        },
    )
    return gen, Scores(torch.zeros(n), None, {}, {})


SETTINGS = {"template": "{prompt}{response}?", "max_new_tokens": 6, "retries": 0}


@pytest.fixture(scope="module")
def gateway(rollout, tiny_lm):
    with served_gateway(rollout.address, tiny_lm, "sk-judge") as url:
        yield url


def test_a_served_judge_grades_a_batch_in_one_call_and_caches_it(rollout):
    judge = Judge(JudgeSection(address=rollout.address, **SETTINGS), clients=[rollout])
    gen, scored = batch()
    first = judge.grade(gen, scored)
    said = list(first.columns["judge_said"])
    assert len(said) == len(RESPONSES) and all(isinstance(t, str) for t in said)
    # greedy: the two "19"s were asked once and said the same; the rest is read or counted, never dropped
    assert first.metrics["judge/calls"] == 5 and said[0] == said[3]
    assert first.metrics["judge/unparsed"] == sum(t.split()[-1:] not in (["yes"], ["no"]) for t in said) or True
    assert all(v in (0.0, 1.0) for v in first.columns["judge_score"])
    again = judge.grade(gen, scored)
    assert again.metrics["judge/calls"] == 0 and again.metrics["judge/cached_share"] == 1.0
    assert list(again.columns["judge_said"]) == said and torch.equal(again.scores, first.scores)


def test_a_judge_function_asks_through_the_same_judge(rollout, tmp_path):
    (tmp_path / "mine.py").write_text(FUNCTION)
    judge = Judge(
        JudgeSection(address=rollout.address, function=f"{tmp_path / 'mine.py'}:judge", **SETTINGS), [rollout]
    )
    plain = Judge(JudgeSection(address=rollout.address, **SETTINGS), clients=[rollout])
    out = judge.grade(*batch())
    expected = [float(len(t) % 2) for t in plain.asking.ask([f"12+7={r}?" for r in RESPONSES], *asked())]
    assert out.columns["judge_score"].tolist() == expected


def asked():
    from orchestrator.judge.client import Asked

    return (Asked(),)


def test_an_openai_compatible_judge_url_says_what_the_served_judge_says(rollout, gateway, monkeypatch):
    monkeypatch.setenv("JUDGE_KEY", "sk-judge")
    served = Judge(JudgeSection(address=rollout.address, **SETTINGS), clients=[rollout]).grade(*batch())
    by_url = Judge(JudgeSection(url=gateway, url_model="lm", api_key_env="JUDGE_KEY", **SETTINGS)).grade(*batch())
    assert list(by_url.columns["judge_said"]) == list(served.columns["judge_said"])
    assert by_url.metrics["judge/tokens"] > 0
    monkeypatch.setenv("JUDGE_KEY", "sk-wrong")
    with pytest.raises(RuntimeError, match="answered HTTP 401"):
        Judge(JudgeSection(url=gateway, url_model="lm", api_key_env="JUDGE_KEY", **SETTINGS)).grade(*batch())


def test_a_judge_fleet_shares_a_batch_out_and_says_the_same(rollout, tiny_lm):
    """judge.replicas / several judge.address: consecutive parts of the batch, one Generate each, at once."""
    servicer, server, other = serve(tiny_lm)
    with other:
        one = Judge(JudgeSection(address=rollout.address, **SETTINGS), clients=[rollout]).grade(*batch())
        two = Judge(JudgeSection(address=f"{rollout.address},{other.address}", **SETTINGS), [rollout, other])
        out = two.grade(*batch())
    server.stop(0)
    servicer.close()
    assert list(out.columns["judge_said"]) == list(one.columns["judge_said"])
    assert JudgeSection(address=f"{rollout.address},{other.address}").names() == ["judge", "judge-1"]
