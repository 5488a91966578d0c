"""The bundled tool task's data: calculator traces as SFT answers, which the calculator environment
plays back turn by turn to the right score."""

import pandas as pd

from meshrl.tiny.arithmetic import ArithmeticConfig, make_data
from services.env.calculator import CALL, Calculator


def test_tool_traces_replay_through_the_calculator(tmp_path):
    paths = make_data(tmp_path, ArithmeticConfig(num_train=50, num_test=10, ops="*", max_operand=99, tool=True))
    for row in pd.read_parquet(paths["train"]).to_dict("records"):
        a, b = row["extra_info"]["question"].rstrip("=").split("*")
        truth = row["reward_model"]["ground_truth"]
        assert truth == str(int(a) * int(b))
        trace = row["extra_info"]["answer"]
        call, rest = trace.split("</calc>", 1)  # the first turn ends at the environment's stop string
        env = Calculator()
        env.reset({"ground_truth": truth})
        obs, reward, done, _ = env.step(call + "</calc>")
        assert CALL.search(call) and obs == f"<result>{truth}</result>" and not done
        assert rest.startswith(obs)
        _, reward, done, info = env.step(rest[len(obs) :])
        assert done and reward == 1.0 and info["tool_calls"] == 1


def test_without_tool_the_answer_is_the_number(tmp_path):
    paths = make_data(tmp_path, ArithmeticConfig(num_train=5, num_test=2, ops="*", max_operand=9))
    row = pd.read_parquet(paths["train"]).iloc[0]
    assert row["extra_info"]["answer"] == row["reward_model"]["ground_truth"]


def test_the_calculator_evaluates_integers_only():
    import pytest

    from services.env.calculator import evaluate

    assert evaluate("12*(3+4)-5") == 79 and evaluate("-7//2") == -4 and evaluate("17 % 5") == 2
    for bad, match in [
        ("__import__('os')", "only integers"),
        ("2**10", "only integers"),
        ("1.5*2", "only integers"),
        ("1/0", "only integers"),
        ("5//0", "division by zero"),
        ("9" * 61, "wider than 60"),
        ("1+" * 150 + "1", "longer than 200"),
        ("1+", "cannot parse"),
    ]:
        with pytest.raises(ValueError, match=match):
            evaluate(bad)
