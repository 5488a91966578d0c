"""Code graded by running it (services/reward/scorers/code.py) in a real sandbox service over gRPC: verl's
stdin/stdout cases, APPS's call cases and MBPP's asserts, partial credit as the fraction passed, a program
that ends its test early or never ends failing its cases, and a sandbox that cannot be reached failing the
sample, through the reward service's own workers."""

import json

import pytest
import torch

from meshrl.codec import Payload
from meshrl.config.reward import RewardConfig
from meshrl.config.sandbox import SandboxConfig
from meshrl.dataproto import DataProto
from meshrl.rpc import Server
from meshrl.v1 import reward_pb2
from services.reward.scorers import code, default_compute_score
from services.reward.servicer import RewardServicer
from services.sandbox.servicer import SandboxServicer

DOUBLE = {"inputs": ["3\n", "10\n", "-2\n"], "outputs": ["6\n", "20\n", "-4"]}


@pytest.fixture(scope="module")
def sandbox():
    server = Server([SandboxServicer(SandboxConfig(concurrency=4))]).start()
    yield server.address
    server.stop(0)


@pytest.fixture
def address(sandbox, monkeypatch):
    monkeypatch.setenv(code.VAR, sandbox)
    return sandbox


def score(response: str, truth, **extra):
    return default_compute_score("code", response, json.dumps(truth), extra or None)


def test_stdin_cases_give_the_fraction_passed(address):
    right = "Here:\n```python\nprint(int(input()) * 2)\n```"
    assert score(right, DOUBLE) == {"score": 1.0, "acc": True, "passed": 3, "total": 3}
    partly = "```python\nn = int(input())\nprint(n * 2 if n > 0 else n)\n```"
    assert score(partly, DOUBLE)["passed"] == 2
    assert score("print(input())", DOUBLE)["score"] == 0.0  # no fence: the whole response is the program


def test_call_cases_and_asserts(address):
    fn = {"fn_name": "add", "inputs": [[1, 2], [5, 5]], "outputs": [[3], 10]}
    assert score("def add(a, b):\n    return a + b\n", fn)["acc"]
    asserts = ["assert add(1, 2) == 3", "assert add(0, 0) == 0", "assert add(2, 2) == 5"]
    assert score("def add(a, b):\n    return a + b\n", asserts)["passed"] == 2
    assert score("def add(a, b):\n    return a + b\n", {"asserts": asserts[:1]})["acc"]


def test_a_program_that_cheats_or_hangs_fails_its_cases(address):
    asserts = ["assert add(1, 2) == 3"]
    assert score("import os\nos._exit(0)\ndef add(a, b): return 0\n", asserts)["score"] == 0.0
    hang = score("while True:\n    pass\n", DOUBLE, timeout=1)
    assert hang["passed"] == 0


def test_bad_truth_and_no_sandbox_raise_rather_than_score_zero(address, monkeypatch):
    with pytest.raises(ValueError, match="ground_truth must hold"):
        score("print(1)", {"cases": []})
    monkeypatch.delenv(code.VAR)
    with pytest.raises(RuntimeError, match="no sandbox service"):
        score("print(1)", DOUBLE)


def test_the_reward_service_workers_grade_code_in_the_sandbox(sandbox):
    servicer = RewardServicer(RewardConfig(workers=1, sandbox=sandbox, on_error="score", error_score=-1.0))
    try:
        responses = ["print(int(input()) * 2)", "print(0)", "```python\nwhile True: pass\n```"]
        ids = torch.zeros(3, 1, dtype=torch.long)
        batch = DataProto(
            {"responses": ids, "response_mask": torch.ones_like(ids)},
            {
                "data_source": ["code"] * 3,
                "response_text": responses,
                "reward_model": [{"ground_truth": json.dumps(DOUBLE)}] * 3,
                "extra_info": [{"timeout": 1}] * 3,
            },
        )
        reply = servicer.Score(Payload(reward_pb2.ScoreRequest(), batch), None)
        assert reply.data.batch["scores"].tolist() == [1.0, 0.0, 0.0]
    finally:
        servicer.scorer.close()
