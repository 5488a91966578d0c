"""What the scorer takes from each row, checked before any service starts (orchestrator.lifecycle.scorer_inputs,
through preflight), the rows carrying it there, and a first step that scores every sample the same, said aloud."""

import json
import logging
import types

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from meshrl.reward_forms import trl_form
from orchestrator.config import load_config
from orchestrator.data import PromptDataset, dataset
from orchestrator.lifecycle.mesh import reward_request
from orchestrator.lifecycle.preflight import check
from orchestrator.loops.policy_gradient import grpo, warn_if_flat
from orchestrator.main import LOOPS

VERL_FN = "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n"
TRL_FN = "import sys\nsys.exit('ran at import')\ndef accuracy_reward(completions, solution, **kwargs):\n    return []\n"


@pytest.fixture
def trl_data(tmp_path):
    """TRL's layout: `prompt` as chat messages and a `solution` column; no reward_model, no data_source."""
    rows = [{"prompt": [{"role": "user", "content": f"{i}+1="}], "solution": str(i + 1)} for i in range(8)]
    path = tmp_path / "trl.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def checked(tiny_lm, data, *extra):
    cfg = load_config(None, [f"actor.model={tiny_lm}", f"data.train_files={data}", "data.train_batch_size=4", *extra])
    check(cfg, LOOPS["grpo"]().setup(cfg))
    return cfg


def reward_file(tmp_path, text: str, name: str) -> str:
    f = tmp_path / "reward.py"
    f.write_text(text)
    return f"reward.function={f}:{name}"


def test_rows_without_a_ground_truth_stop_a_scorer_that_takes_one(tiny_lm, trl_data, tmp_path):
    """All-zero rewards with rc 0 before: now one line naming data.answer_key and the columns there are."""
    verl = reward_file(tmp_path, VERL_FN, "compute_score")
    want = (
        r"data.train_files has no ground truth in any row \(reward_model.ground_truth\) and "
        r"reward.function=.*:compute_score takes one: set data.answer_key to the column holding the answers "
        r"\(columns: \['prompt', 'solution'\]\)"
    )
    with pytest.raises(ValueError, match=want):
        checked(tiny_lm, trl_data, verl)
    with pytest.raises(
        ValueError, match=r"the built-in scorer \(reward.function unset\) takes one: set data.answer_key"
    ):
        checked(tiny_lm, trl_data)
    checked(tiny_lm, trl_data, verl, "data.answer_key=solution")
    with pytest.raises(ValueError, match=r"data.answer_key=answer: data.train_files has no such column \(columns: "):
        checked(tiny_lm, trl_data, verl, "data.answer_key=answer")
    # a function that scores without a ground truth says so with a default
    checked(
        tiny_lm,
        trl_data,
        reward_file(tmp_path, VERL_FN.replace("ground_truth,", "ground_truth=None,"), "compute_score"),
    )


def test_the_bundled_verl_data_passes(tiny_lm, arithmetic_data, tmp_path):
    checked(tiny_lm, arithmetic_data["train"], f"data.val_files={arithmetic_data['test']}")
    checked(tiny_lm, arithmetic_data["train"], reward_file(tmp_path, VERL_FN, "compute_score"))


def test_code_rows_for_the_built_in_scorer_need_a_sandbox(tiny_lm, tmp_path):
    """Rows the built-in code scorer grades would each fail at the first step without a sandbox to run in."""
    from meshrl.tiny.code import CodeConfig, make_data

    data = make_data(tmp_path / "code", CodeConfig(num_test=10))
    with pytest.raises(
        ValueError, match=r"data.train_files has rows of data_source 'code', .* set reward.sandbox=auto"
    ):
        checked(tiny_lm, data["train"])
    checked(tiny_lm, data["train"], "reward.sandbox=auto")
    checked(tiny_lm, data["train"], reward_file(tmp_path, VERL_FN, "compute_score"))  # a function of the user's


def test_a_trl_function_is_checked_against_the_columns_without_running_it(tiny_lm, trl_data, tmp_path):
    checked(tiny_lm, trl_data, reward_file(tmp_path, TRL_FN, "accuracy_reward"))  # TRL's data, TRL's function
    with pytest.raises(
        ValueError,
        match=r"takes \['answer'\], and data.train_files has no such column .*"
        r"columns: \['prompt', 'solution'\]",
    ):
        checked(tiny_lm, trl_data, reward_file(tmp_path, TRL_FN.replace("solution", "answer"), "accuracy_reward"))


def test_a_function_of_neither_form_stops_the_run_before_anything_starts(tiny_lm, trl_data, tmp_path):
    """It was refused only once the reward service started, after the actor and rollout, with a traceback."""
    spec = reward_file(tmp_path, "def reward(responses, answers):\n    return [0.0]\n", "reward")
    with pytest.raises(ValueError, match=r"reward.function=.*:reward is neither reward function form: .* TRL calls"):
        checked(tiny_lm, trl_data, spec)


def test_rows_carry_their_dataset_columns_for_a_trl_function(tiny_lm, trl_data, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_lm)
    cfg = load_config(
        None,
        [f"actor.model={tiny_lm}", f"data.train_files={trl_data}", reward_file(tmp_path, TRL_FN, "accuracy_reward")],
    )
    batch = dataset(cfg, "train_files", tokenizer).batch([0, 1], ["a", "b"])
    assert list(batch.non_tensor_batch["dataset_columns"]) == [
        {"prompt": [{"role": "user", "content": "0+1="}], "solution": "1"},
        {"prompt": [{"role": "user", "content": "1+1="}], "solution": "2"},
    ]
    batch.non_tensor_batch["response_text"] = np.array(["1", "3"], dtype=object)  # as the rollout answers
    assert reward_request(batch).non_tensor_batch["dataset_columns"][1]["solution"] == "2"
    # a service given by address running that file gets them too; verl's form: the rows stay as they were
    assert trl_form(
        load_config(
            None, ["reward.address=127.0.0.1:9", reward_file(tmp_path, TRL_FN, "accuracy_reward")]
        ).reward.function
    )
    assert "dataset_columns" not in PromptDataset(str(trl_data), tokenizer, 128).rows[0]


def test_flat_first_scores_are_warned_about_once(caplog):
    with caplog.at_level(logging.WARNING):
        warn_if_flat(torch.tensor([0.3, 0.0, 1.0]), 1)
    assert not caplog.text

    class Stop(Exception):
        """Ends the step once its scores are in: the rest of it needs services."""

    class Generated:
        def select(self, keys):
            raise Stop

    scored = types.SimpleNamespace(scores=torch.zeros(8))  # every ground truth empty: all 0
    mesh = types.SimpleNamespace(cfg=load_config(None, []))
    rollouts = types.SimpleNamespace(sample_and_score=lambda *args: (Generated(), scored))
    data = types.SimpleNamespace(batch=lambda *args: None)
    loop = grpo()
    with caplog.at_level(logging.WARNING):
        for number in (1, 2):
            with pytest.raises(Stop):
                loop.step(mesh, rollouts, number, data, [0], ["u"])
    assert caplog.text.count("ALL 8 samples scored 0") == 1 and "step 1:" in caplog.text
