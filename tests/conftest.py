"""Shared test fixtures: tiny model folders and data, built once per session (no downloads); which
devices the suite may see.

The default suite is the CPU suite, on any machine: where there are GPUs it hides them
(CUDA_VISIBLE_DEVICES=""), before torch looks, so the services it starts behave as in
CI (two FSDP ranks on a 1-GPU machine would otherwise be refused). The GPU lane
(scripts/test_gpu.sh: MESHRL_TEST_GPU=1, tests marked gpu) sees them; its tests
skip where there is no CUDA. The actor's checkpoint key file (services/actor/integrity.py) goes to a
folder of the session's own (XDG_CONFIG_HOME), not the user's home.
"""

import os
import tempfile

if os.environ.get("MESHRL_TEST_GPU") != "1":
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="meshrl-test-config-")

import pytest  # noqa: E402

from meshrl.tiny.arithmetic import ArithmeticConfig, make_data
from meshrl.tiny.models import TinyModelConfig, make_model


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
