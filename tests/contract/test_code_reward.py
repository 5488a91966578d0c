"""Code run in a real sandbox service over gRPC. Graded (services/reward/scorers/code.py): verl's
stdin/stdout cases, APPS's call cases and MBPP's asserts, partial credit as the fraction passed, a program
that ends its test early or never ends failing its cases, and a sandbox that cannot be reached failing the
sample, through the reward service's own workers and with a sandbox of its own (--sandbox auto). As tools
(services/env/code_tools.py): python and bash calls of an episode in the env service's worker processes,
sharing its files until it closes."""

import json

import pytest
import torch

from meshrl.codec import Payload
from meshrl.config.env import EnvConfig
from meshrl.config.reward import RewardConfig
from meshrl.config.sandbox import SandboxConfig
from meshrl.dataproto import DataProto
from meshrl.rpc import Client, Server
from meshrl.v1 import env_pb2, reward_pb2
from services.env.servicer import EnvServicer
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


ALWAYS_EQUAL = """class Answer:
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    def __bool__(self): return True
def add(a, b):
    return Answer()
"""


def test_asserts_pass_no_object_that_equals_everything_nor_a_patched_builtin(address):
    """The best-known code-RL hack (an object whose __eq__ always says True), a replaced builtin and
    arithmetic that answers what it is compared with pass no assert case; the right program passes them
    all, one that rebinds `list` or starts with a __future__ import too, and a standard library value
    (a Counter against a dict) compares as it always does (services/reward/scorers/asserts.py)."""
    asserts = ["assert add(1, 2) == 3", "assert [add(0, 0)] == [0]", "assert add(2, 2)", "assert not add(1, -1)"]
    assert score(ALWAYS_EQUAL, asserts)["passed"] == 0
    patched = "import builtins\nbuiltins.isinstance = lambda *a: True\ndef add(a, b):\n    return 'no'\n"
    assert score(patched, ["assert isinstance(add(1, 2), int)"])["passed"] == 0
    shadowed = "def abs(x):\n    return 0\nclass Near:\n    def __sub__(self, other): return 0\n"
    shadowed += "def add(a, b):\n    return Near()\n"
    assert score(shadowed, ["assert abs(add(1, 2) - 3) < 1e-9"])["passed"] == 0
    right = "from __future__ import annotations\nlist = [1]\ndef add(a: int, b: int) -> int:\n    return a + b\n"
    assert score(right, [*asserts[:3], "assert isinstance(add(1, 2), int) and add(1, 2) in {3, 4}"])["acc"]
    counts = "from collections import Counter\ndef add(a, b):\n    return Counter([a, b])\n"  # MBPP 88's kind
    assert score(counts, ["assert add(1, 1) == {1: 2}"])["acc"]


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


def test_a_reward_service_with_sandbox_auto_starts_and_stops_its_own(monkeypatch):
    monkeypatch.delenv(code.VAR, raising=False)
    servicer = RewardServicer(RewardConfig(workers=0, sandbox="auto"))
    try:
        assert servicer.sandbox is not None and servicer.sandbox.poll() is None
        assert score("print(int(input()) * 2)", DOUBLE)["acc"]  # in this process (workers=0): its variable
    finally:
        servicer.close()
    assert servicer.sandbox.returncode is not None


def test_code_tools_share_an_episodes_files_in_the_env_services_workers(address):
    env = EnvServicer(EnvConfig(module="services.env.code_tools:CodeTools", processes=1, step_timeout=30))
    server = Server([env]).start()
    client = Client(server.address, env_pb2.DESCRIPTOR.services_by_name["EnvService"], timeout=60, retries=0)
    try:
        episode = client.call("Reset", env_pb2.ResetRequest(task_json="{}")).episode_id
        write = "I will save it.\n```python\nopen('n.txt', 'w').write(str(6 * 7))\nprint('saved')\n```\n"
        reply = client.call("Step", env_pb2.StepRequest(episode_id=episode, action=write))
        assert (reply.observation, reply.done) == ("```output\nsaved\n\n```\n", False)
        call = json.dumps([{"name": "bash", "arguments": {"command": "cat n.txt; exit 3"}}])
        reply = client.call("Step", env_pb2.StepRequest(episode_id=episode, action="", tool_calls_json=call))
        assert list(reply.tool_results) == ["42\n[exit code 3]"]
        assert client.call("Step", env_pb2.StepRequest(episode_id=episode, action="The answer is 42.")).done
    finally:
        server.stop(0)
        env.close()
