"""The external-service contract of docs/wire.md, held by a server built from the protos alone
(minimal_reward_server.py): the orchestrator finds it ready though its health knows no service names,
fills in the optional token-level scores, and trains a GRPO run against it."""

import json
import pathlib
import subprocess
import sys
import time

import pytest

from meshrl.protogen import generate
from orchestrator.config import load_config
from orchestrator.main import run

HERE = pathlib.Path(__file__).parent


@pytest.fixture(scope="module")
def external(tmp_path_factory):
    out = tmp_path_factory.mktemp("generated")
    generate(out)  # grpc_tools.protoc on protos/meshrl/v1/*.proto, nothing else
    for package in (out / "meshrl", out / "meshrl" / "v1"):  # found before the installed meshrl
        (package / "__init__.py").touch()
    port_file = out / "port"
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "minimal_reward_server.py"), str(out), str(port_file)], cwd=out
    )  # cwd: the generated package, not this checkout's meshrl
    deadline = time.monotonic() + 60
    while not (port_file.exists() and port_file.read_text()):
        assert proc.poll() is None and time.monotonic() < deadline, "the minimal server did not start"
        time.sleep(0.1)
    yield f"127.0.0.1:{port_file.read_text()}"
    proc.terminate()
    proc.wait(10)


def test_grpo_trains_against_a_server_built_from_the_protos(external, tiny_lm, arithmetic_data, tmp_path):
    run_dir = run(
        "grpo",
        load_config(
            None,
            [
                f"actor.model={tiny_lm}",
                f"data.train_files={arithmetic_data['train']}",
                "data.train_batch_size=4",
                "rollout.n=4",
                "rollout.backend=hf",
                "actor.engine=plain",
                "trainer.total_steps=2",
                "trainer.logger=[]",
                f"reward.address={external}",
                f"trainer.run_dir={tmp_path / 'run'}",
            ],
        ),
    )
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all("actor/pg_loss" in r for r in rows)
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert all(s["score"] == float(s["response"].strip() == s["ground_truth"]) for s in samples)
