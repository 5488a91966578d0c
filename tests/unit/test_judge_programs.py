"""The judge's programs (orchestrator/judge/programs.py) and how its scores join the reward's
(orchestrator/judge/grading.py): each named parser reads what judges write and refuses what they do not
mean; the pairwise program turns a group's comparisons into win shares; a judged sample's reward is the
weighted sum, the others' the reward service's alone; an unreadable judgement is retried, then scored by
the stated rule, never silently 0. The judge's model calls are tests/contract/test_judge.py's."""

import pytest
import torch

from meshrl.clients import Scores
from meshrl.dataproto import DataProto, object_array
from orchestrator.config import load_config
from orchestrator.judge import programs
from orchestrator.judge.grading import Judge, joined
from orchestrator.judge.settings import JudgeSection

YES, NO = ["yes", "correct"], ["no", "incorrect"]


@pytest.mark.parametrize(
    ("parser", "text", "score"),
    [
        ("verdict", "19 yes", 1.0),
        ("verdict", "Yes.", 1.0),
        ("verdict", "It is not right, so: incorrect", 0.0),  # the last verdict word counts
        ("verdict", "maybe", None),
        ("number", "I rate it 7 out of 10", 1.0),  # the last number is read: here the scale's top, a known trap
        ("number", "Score: 7.5", 0.75),
        ("number", "Score: 11", None),  # off the scale
        ("number", "none", None),
        ("boxed", r"so \boxed{4}", 0.4),
        ("boxed", r"\boxed{four}", None),
        ("json", 'here: {"reason": "ok", "score": 9}', 0.9),
        ("json", '{"score": "nan"}', None),
        ("json", '{not json} {"score": 2}', 0.2),
    ],
)
def test_each_parser_reads_what_judges_write(parser, text, score):
    assert programs.read(parser, text, YES, NO, (0.0, 10.0)) == score


def test_a_template_with_a_field_its_mode_does_not_fill_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"\['answer'\] are not fields of a pointwise prompt"):
        programs.template_text("Q: {prompt} A: {answer}", "pointwise")
    with pytest.raises(ValueError, match="literal brace"):
        programs.template_text("{prompt", "pointwise")
    rubric = tmp_path / "rubric.txt"
    rubric.write_text("Compare {response_a} and {response_b} for {prompt}")
    assert programs.template_text(str(rubric), "pairwise").startswith("Compare")
    assert "{response}" in programs.template_text("", "pointwise")


def test_pairwise_compares_each_two_of_a_group_in_both_orders_and_counts_wins():
    samples = [{"uid": u, "response": r} for u, r in [("g", "1"), ("g", "2"), ("g", "2"), ("h", "5")]]
    pairs = programs.pairwise_pairs(samples)
    assert sorted(pairs) == [(0, 1), (0, 2), (1, 0), (2, 0)]  # equal answers tie unasked; h is alone
    prefs = {(0, 1): 1.0, (1, 0): 0.0, (0, 2): None, (2, 0): 0.0}  # one unreadable comparison is left out
    shares = programs.win_shares(4, pairs, [prefs[p] for p in pairs])
    assert shares == [1.0, 0.0, 0.0, 0.5]


def test_settings_are_checked_naming_the_key():
    with pytest.raises(ValueError, match=r"judge\.mode=listwise must be one of"):
        load_config(None, ["judge.mode=listwise"])
    with pytest.raises(ValueError, match=r"judge\.model and judge\.url set"):
        load_config(None, ["judge.model=m", "judge.url=http://x/v1"])
    assert load_config(None, ["judge.url=http://x/v1"]).judge.given
    # a rubric on the command line is text, braces and all, not a YAML mapping
    assert load_config(None, ["judge.template={prompt}{response}?"]).judge.template == "{prompt}{response}?"
    assert load_config(None, ["judge.template={prompt}"]).judge.template == "{prompt}"
    with pytest.raises(ValueError, match=r"judge.max_new_tokens=\{1': the value is not YAML"):
        load_config(None, ["judge.max_new_tokens={1"])


class Said:
    """A stand-in for the judge's calls (JudgeClient.ask): answers by prompt, counting them."""

    def __init__(self, answers):
        self.answers, self.asked, self.clients = answers, [], []

    def ask(self, prompts, asked, seed=0, temperature=None):
        self.asked.append((list(prompts), temperature))
        asked.calls += len(prompts)
        return [self.answers(p, temperature) for p in prompts]


def batch(responses, sources=None, uids=None) -> tuple[DataProto, Scores]:
    n = len(responses)
    gen = DataProto(
        {"response_mask": torch.tensor([[1, 1, 0]] * n)},
        {
            "prompt": object_array([[{"role": "user", "content": "1+1="}]] * n),
            "response_text": object_array(responses),
            "data_source": object_array(sources or ["a"] * n),
            "uid": object_array(uids or [str(i) for i in range(n)]),
            "reward_model": object_array([{"ground_truth": "2"}] * n),
        },
    )
    rule = torch.tensor([float(r == "2") for r in responses])
    token_level = torch.zeros(n, 3)
    token_level[:, 1] = rule  # the last response token
    return gen, Scores(rule, token_level, {"acc": object_array([r == "2" for r in responses])}, {})


def judge_with(answers, **settings) -> tuple[Judge, Said]:
    judge = Judge(JudgeSection(**{"url": "http://unused/v1", "template": "{prompt}{response}?", **settings}))
    said = Said(answers)
    judge.asking = said  # type: ignore[assignment]
    return judge, said


def test_a_judged_reward_is_the_weighted_sum_and_other_sources_keep_the_rule():
    judge, _ = judge_with(lambda p, t: "yes" if p.endswith("3?") else "no", weight=2.0, reward_weight=0.5,
                          data_sources=["a"])  # fmt: skip
    gen, scored = batch(["2", "3", "2"], sources=["a", "a", "b"])
    out = judge.grade(gen, scored)
    assert out.scores.tolist() == [0.5, 2.0, 1.0]  # 0.5 x rule + 2 x judge; row 2 is not judged
    assert out.token_level_scores[:, 1].tolist() == [0.5, 2.0, 1.0]  # on the last response token
    assert list(out.columns["judge_score"]) == [0.0, 1.0, None]
    assert out.metrics["judge/calls"] == 2 and out.columns["acc"].tolist() == [True, False, True]


def test_an_unreadable_judgement_is_asked_again_then_scored_by_the_rule_never_silently():
    tries = {"n": 0}

    def answers(prompt, temperature):
        tries["n"] += 1
        return "hmm" if prompt.startswith("1+1=2") or temperature is None else "yes"

    judge, said = judge_with(answers, retries=2, default_score=0.25)
    out = judge.grade(*batch(["2", "5"]))
    assert out.columns["judge_score"].tolist() == [0.25, 1.0]  # "5" was read on its retry, sampled
    assert [t for _, t in said.asked] == [None, 1.0, 1.0] and out.metrics["judge/unparsed"] == 1
    judge, _ = judge_with(lambda p, t: "hmm", retries=0, on_unparsed="fail")
    with pytest.raises(ValueError, match=r"judgement of sample 0 cannot be read by judge.parser=verdict: 'hmm'"):
        judge.grade(*batch(["2"]))


def test_pairwise_judges_a_group_against_itself():
    # the judge prefers the answer that is right: A when A is "2"
    judge, said = judge_with(
        lambda p, t: "A" if "A: 2" in p else "B", mode="pairwise", template="A: {response_a} B: {response_b}"
    )
    out = judge.grade(*batch(["2", "7", "9", "2"], uids=["g", "g", "g", "h"]))
    assert out.columns["judge_score"].tolist() == [1.0, 0.25, 0.25, 0.5]  # 7 and 9 split their game
    assert len(said.asked[0][0]) == 6


def test_joined_keeps_the_reward_alone_where_there_is_no_token_level():
    cfg = JudgeSection(url="http://x/v1")
    scored = Scores(torch.tensor([1.0, 0.0]), None, {}, {})
    out = joined(cfg, scored, torch.tensor([0.5, float("nan")]), [0], None, ["yes"])
    assert out.scores.tolist() == [1.5, 0.0] and out.token_level_scores is None


def test_a_judge_functions_nan_is_unreadable_not_a_reward(tmp_path):
    (tmp_path / "mine.py").write_text("def judge(samples, ask):\n    return [float('nan'), None, 0.5]\n")
    judge, _ = judge_with(lambda p, t: "", function=f"{tmp_path / 'mine.py'}:judge", default_score=0.25)
    out = judge.grade(*batch(["2", "3", "4"]))
    assert out.columns["judge_score"].tolist() == [0.25, 0.25, 0.5] and out.metrics["judge/unparsed"] == 2
