"""Built-in rule scorers against hand-written cases, tricky formats included."""

import pytest

from services.reward.scorers import BY_DATA_SOURCE, arithmetic, boxed_math, default_compute_score, format_reward, gsm8k


@pytest.mark.parametrize(
    "response,gt,score,fmt",
    [
        ("19", "19", 1.0, True),
        ("  19  \nbecause 12+7", "19", 1.0, True),
        ("-3", "-3", 1.0, True),
        ("+7", "7", 1.0, True),
        ("18", "19", 0.0, True),
        ("19.0", "19", 0.0, False),
        ("the answer is 19", "19", 0.0, False),
        ("", "19", 0.0, False),
        ("1 9", "19", 0.0, False),
    ],
)
def test_arithmetic(response, gt, score, fmt):
    r = arithmetic.compute_score("arithmetic", response, gt)
    assert r["score"] == score and r["format_ok"] == fmt and r["acc"] == (score == 1.0)


@pytest.mark.parametrize(
    "response,gt,method,acc",
    [
        ("so she has 72 apples.\n#### 72", "72", "strict", True),
        ("#### -5", "-5", "strict", True),
        ("The total is #### 1,234", "1234", "strict", True),
        ("#### $1,234.", "1234", "strict", True),
        ("#### 18.0", "18", "strict", True),  # by value
        ("#### 3 wait, no: #### 4", "4", "strict", True),  # the last #### is the answer
        ("#### 3 wait, no: #### 4", "3", "strict", False),
        ("#### 72 apples and more text after", "72", "strict", True),
        ("the answer is 72", "72", "strict", False),  # strict needs ####
        ("the answer is 72", "72", "flexible", True),
        ("it costs $1,000 and then -12.5 is left.", "-12.5", "flexible", True),
        ("first 3 then 5", "3", "flexible", False),  # flexible takes the last number
        ("no numbers here", "3", "flexible", False),
    ],
)
def test_gsm8k(response, gt, method, acc):
    assert gsm8k.compute_score("openai/gsm8k", response, gt, method=method)["acc"] is acc


def test_gsm8k_searches_only_the_end_of_long_responses():
    long = "#### 5 " + "x" * 400
    assert gsm8k.extract_solution(long) is None


@pytest.mark.parametrize(
    "response,gt,acc",
    [
        ("so \\boxed{42}", "42", True),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", True),
        ("\\boxed{0.5}", "\\frac{1}{2}", True),  # equivalent, by math-verify
        ("\\boxed{\\dfrac{1}{2}}", "\\frac{1}{2}", True),
        ("\\boxed{x^{2}+1}", "1+x^2", True),
        ("first \\boxed{3}, finally \\boxed{4}", "4", True),  # the last box
        ("\\boxed{\\sqrt{2}}", "2", False),
        ("\\boxed{5", "5", False),  # cut off
        ("the answer is 5", "5", False),
    ],
)
def test_boxed_math(response, gt, acc):
    assert boxed_math.compute_score("lighteval/MATH", response, gt)["acc"] is acc


def test_last_boxed_balances_braces():
    assert boxed_math.last_boxed("\\boxed{\\frac{a}{b}} and \\fbox{\\{1,2\\}}") == "\\{1,2\\}"
    assert boxed_math.last_boxed("nothing") is None


def test_format_reward():
    good = "<think>12+7 is 19</think> <answer>19</answer>"
    assert format_reward.compute_score("format", good)["score"] == 1.0
    assert format_reward.compute_score("format", "19")["score"] == 0.0
    assert format_reward.compute_score("format", "ANSWER: 19", extra_info={"format_pattern": r"ANSWER: \d+"})[
        "format_ok"
    ]


def test_dispatch_by_data_source():
    assert default_compute_score("arithmetic", "7", "7")["score"] == 1.0
    assert default_compute_score("openai/gsm8k", "#### 7", "7")["score"] == 1.0
    with pytest.raises(ValueError, match="no built-in scorer for data_source 'nope'"):
        default_compute_score("nope", "7", "7")
    with pytest.raises(ValueError, match="ground_truth is missing"):
        default_compute_score("arithmetic", "7", None)
    assert all(callable(f) for f in BY_DATA_SOURCE.values())
