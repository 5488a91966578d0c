"""Shared test fixtures: tiny model folders and data, built once per session (no downloads); which
devices the suite may see.

The default suite is the CPU suite, on any machine: where there are GPUs it hides them
(CUDA_VISIBLE_DEVICES=""), before torch looks, so the services it starts behave as in
CI (two FSDP ranks on a 1-GPU machine would otherwise be refused). The GPU lane
(scripts/test_gpu.sh: MESHRL_TEST_GPU=1, tests marked gpu) sees them; its tests
skip where there is no CUDA. The actor's checkpoint key file (services/actor/integrity.py) goes to a
folder of the session's own (XDG_CONFIG_HOME), not the user's home. In one process the type check starts
as soon as the tests are collected and runs beside them (tests/unit/test_types.py); on pytest-xdist
workers (scripts/test.sh) it is a test of its own, among the first files (FIRST), and each worker keeps
to its own share of the cores (pin_worker). The services the session's runs start are forked from one
fork server (one_fork_server), as a `meshrl <algorithm>` run's are from its own.
"""

import os
import tempfile


def pin_worker() -> None:
    """On pytest-xdist workers (scripts/test.sh), each worker and every service it starts keeps to its own
    share of the cores (MESHRL_TEST_PIN=0: not). Unpinned, two workers' torch and OpenMP thread pools spun
    against each other: the LoRA learning test took 219 s beside the tool-learning test, 108 s pinned."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", 0))
    if not worker.startswith("gw") or os.environ.get("MESHRL_TEST_PIN", "1") != "1" or not count:
        return
    from meshrl.hosts import parse_cpus, share_cores  # os alone: nothing is set up by importing it

    os.sched_setaffinity(0, parse_cpus(share_cores(count)[int(worker[2:]) % count]))


pin_worker()
if os.environ.get("MESHRL_TEST_GPU") != "1":
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="meshrl-test-config-")

import pytest  # noqa: E402

from meshrl.tiny.arithmetic import ArithmeticConfig, make_data  # noqa: E402
from meshrl.tiny.models import TinyModelConfig, make_model  # noqa: E402

# Test files that take longest, first: on two workers (scripts/test.sh) the last file to start should be a
# short one. Then the rest of e2e, contract, gpu and unit, each in its usual order.
FIRST = (
    "tests/e2e/test_learning.py",  # one warm-up, then GRPO, ahead, LoRA, across Ray nodes and OPD, ~7 min
    "tests/e2e/test_tool_template_learning.py",  # the tool task in the model's own format, by an agent, ~7 min
    "tests/e2e/test_tool_learning.py",
    "tests/e2e/test_moe_run.py",  # the MoE recipe's warm-up and GRPO, ~3 min
    "tests/e2e/test_visual_learning.py",  # the visual task's warm-up and GRPO, ~3 min
    "tests/unit/test_types.py",  # mypy, about a minute cold
    "tests/e2e/test_compose.py",
    "tests/e2e/test_chaos.py",
    "tests/e2e/test_fleet.py",
    "tests/e2e/test_grpo_loop.py",
    "tests/e2e/test_weight_sync.py",
    "tests/e2e/test_loops.py",
    "tests/e2e/test_ray_nodes.py",
)
LAYERS = ("tests/e2e/", "tests/contract/", "tests/gpu/", "tests/unit/")


def pytest_collection_modifyitems(config, items):
    def rank(item) -> tuple[int, int]:
        path = item.nodeid.split("::")[0]
        if path in FIRST:
            return 0, FIRST.index(path)
        return 1, next((i for i, layer in enumerate(LAYERS) if path.startswith(layer)), len(LAYERS))

    items.sort(key=rank)  # stable: a file's tests keep their order


def pytest_collection_finish(session):
    """The type check, when it is among the tests, starts now and runs beside the others (testkit/mypy_check.py Early);
    on xdist workers it runs as a test of its own, first on one of them (the other worker is the company)."""
    if hasattr(session.config, "workerinput"):
        return
    if any(item.nodeid.startswith("tests/unit/test_types.py") for item in session.items):
        from testkit.mypy_check import Early

        session.config.mypy_early = Early()


def pytest_unconfigure(config):
    early = getattr(config, "mypy_early", None)
    if early is not None and early.proc.poll() is None:  # the session stopped before the test read it
        early.proc.kill()
        early.proc.wait()


@pytest.fixture(scope="session", autouse=True)
def one_fork_server():
    """The session's runs fork their services from one fork server (meshrl.forkserver.keep), started by the
    first service a test asks for: a run's services start as `meshrl <algorithm>`'s do, without importing
    torch and transformers again for each run (~9 CPU-seconds a run on this machine)."""
    from meshrl import forkserver

    forkserver.keep()
    yield
    forkserver.release()


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("models") / "lm", TinyModelConfig(kind="causal"))


@pytest.fixture(scope="session")
def bpe_lm(tmp_path_factory):
    """A Qwen2.5-shaped tiny model: byte-level BPE, ChatML template, two end tokens (meshrl/tiny/bpe.py)."""
    return make_model(tmp_path_factory.mktemp("models") / "bpe", TinyModelConfig(family="qwen2", tokenizer="bpe"))


@pytest.fixture(scope="session")
def bpe_tok(bpe_lm):
    """bpe_lm's tokenizer: what the gateway's tests render chats and tool calls with."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(bpe_lm)


@pytest.fixture(scope="session")
def tiny_rm(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("models") / "rm", TinyModelConfig(kind="reward"))


@pytest.fixture(scope="session")
def arithmetic_data(tmp_path_factory):
    return make_data(
        tmp_path_factory.mktemp("data"), ArithmeticConfig(num_train=300, num_test=50, ops="+-", max_operand=20)
    )
