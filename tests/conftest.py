"""Shared test fixtures: tiny model folders and data, built once per session (no downloads); which
devices the suite may see.

The default suite is the CPU suite, on any machine: where there are GPUs it hides them
(CUDA_VISIBLE_DEVICES=""), before torch looks, so the services it starts behave as in
CI (two FSDP ranks on a 1-GPU machine would otherwise be refused). The GPU lane
(scripts/test_gpu.sh: MESHRL_TEST_GPU=1, tests marked gpu) sees them; its tests
skip where there is no CUDA. The actor's checkpoint key file (services/actor/integrity.py) goes to a
folder of the session's own (XDG_CONFIG_HOME), not the user's home. The type check starts as soon as
the tests are collected and runs beside them (tests/unit/test_types.py).
"""

import os
import tempfile

if os.environ.get("MESHRL_TEST_GPU") != "1":
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="meshrl-test-config-")

import pytest  # noqa: E402

from meshrl.tiny.arithmetic import ArithmeticConfig, make_data
from meshrl.tiny.models import TinyModelConfig, make_model


def pytest_collection_finish(session):
    """The type check, when it is among the tests, starts now and runs beside the others (test_types.Early)."""
    if any(item.nodeid.startswith("tests/unit/test_types.py") for item in session.items):
        from tests.unit.test_types import Early

        session.config.mypy_early = Early()


def pytest_unconfigure(config):
    early = getattr(config, "mypy_early", None)
    if early is not None and early.proc.poll() is None:  # the session stopped before the test read it
        early.proc.kill()
        early.proc.wait()


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("models") / "lm", TinyModelConfig(kind="causal"))


@pytest.fixture(scope="session")
def tiny_rm(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("models") / "rm", TinyModelConfig(kind="reward"))


@pytest.fixture(scope="session")
def arithmetic_data(tmp_path_factory):
    return make_data(
        tmp_path_factory.mktemp("data"), ArithmeticConfig(num_train=300, num_test=50, ops="+-", max_operand=20)
    )
