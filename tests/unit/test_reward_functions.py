"""Loading user reward functions by path and checking what they return."""

import math

import numpy as np
import pytest
import torch

from meshrl.algos.masked import token_level
from services.reward.functions import check_result, load

VERL_STYLE = '''
import re

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """A reward file as verl users write them."""
    m = re.search(r"-?\\d+", solution_str)
    return {"score": float(m is not None and m.group(0) == ground_truth), "found": m is not None}
'''


def test_load_a_verl_reward_file_by_path(tmp_path):
    f = tmp_path / "my_reward.py"
    f.write_text(VERL_STYLE)
    fn = load(f"{f}:compute_score")
    assert fn("arithmetic", "it is 19", "19") == {"score": 1.0, "found": True}


@pytest.mark.parametrize(
    "spec,match",
    [
        ("no_colon.py", "must look like"),
        ("/does/not/exist.py:f", "does not exist"),
    ],
)
def test_bad_specs(spec, match):
    with pytest.raises(ValueError, match=match):
        load(spec)


def test_missing_function_and_broken_file(tmp_path):
    f = tmp_path / "r.py"
    f.write_text("x = 1\n")
    with pytest.raises(ValueError, match="has no function 'compute_score'"):
        load(f"{f}:compute_score")
    f.write_text("def compute_score(:\n")
    with pytest.raises(ValueError, match="could not import .*SyntaxError"):
        load(f"{f}:compute_score")


@pytest.mark.parametrize(
    "result,expected",
    [
        (1, (1.0, {})),
        (0.5, (0.5, {})),
        (np.float32(0.25), (0.25, {})),
        (torch.tensor(2.0), (2.0, {})),
        ({"score": 1.0, "acc": True, "pred": "19"}, (1.0, {"acc": True, "pred": "19"})),
    ],
)
def test_good_results(result, expected):
    assert check_result(result) == expected


@pytest.mark.parametrize(
    "result,match",
    [
        (math.nan, "returned nan, expected a finite number"),
        (math.inf, "returned inf"),
        ("1.0", "returned a str"),
        (None, "returned a NoneType"),
        (True, "returned a bool"),
        ([1.0], "returned a list"),
        ({"acc": 1}, "without 'score'"),
        ({"score": "high"}, "returned a str"),
        ({"score": 1.0, "detail": [1, 2]}, "extra 'detail' is a list"),
    ],
)
def test_bad_results_say_what_was_wrong(result, match):
    with pytest.raises(ValueError, match=match):
        check_result(result)


def test_token_level_scores_sit_on_the_last_response_token():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]])
    out = token_level(torch.tensor([1.0, 2.0, 3.0, 4.0]), mask)
    assert out.tolist() == [[0, 0, 1, 0], [2, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 4]]
