"""Shared test fixtures: tiny model folders and data, built once per session (no downloads)."""

import pytest

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
    return make_data(tmp_path_factory.mktemp("data"),
                     ArithmeticConfig(num_train=300, num_test=50, ops="+-", max_operand=20))
