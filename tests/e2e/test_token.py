"""A run whose environment holds MESHRL_TOKEN: every service it starts requires the token, every client
in the mesh sends it (orchestrator, reward client, the actor's weight push), and it never appears on a
command line; a run without one that starts its services itself makes a token of its own."""

import subprocess
import sys

import grpc
import psutil

from meshrl.errors import ServiceError
from meshrl.rpc import Client
from meshrl.v1 import reward_pb2

REWARD = reward_pb2.DESCRIPTOR.services_by_name["RewardService"]
TOKEN = "s3cret-token-for-tests"


def run_and_probe(tiny_lm, arithmetic_data, run) -> tuple[list[str], grpc.StatusCode | None]:
    """A 2-step GRPO run; while it runs, the command lines of its services and what an anonymous
    Describe on its reward service gets (None: it answered)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "meshrl.cli", "grpo", f"actor.model={tiny_lm}", f"data.train_files={arithmetic_data['train']}",
         f"trainer.run_dir={run}", "trainer.total_steps=2", "trainer.val_every=0", "trainer.logger=[console]",
         "trainer.trace=", "rollout.backend=hf", "reward.workers=1", "data.train_batch_size=4", "rollout.n=2",
         "trainer.save_every=2"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    services, out, code = [], [], None
    for line in proc.stdout:  # check the services while they run
        out.append(line)
        if "started reward service at" in line:
            address = line.split()[-1].strip()
            services = [" ".join(p.cmdline()) for p in psutil.Process(proc.pid).children(recursive=True)]
            with Client(address, REWARD, token="", timeout=10, retries=0) as anonymous:
                try:
                    anonymous.call("Describe")
                except ServiceError as e:
                    code = e.code
    assert proc.wait(300) == 0, "".join(out[-30:])
    assert (run / "checkpoints" / "step_2").is_dir()  # trained, pushed weights and saved with the token
    return services, code


def test_a_run_with_a_token_in_its_environment(tiny_lm, arithmetic_data, tmp_path, monkeypatch):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    monkeypatch.setenv("MESHRL_TOKEN_FILE", str(token_file))
    services, code = run_and_probe(tiny_lm, arithmetic_data, tmp_path / "run")
    assert code == grpc.StatusCode.UNAUTHENTICATED
    assert len(services) >= 3 and not any(TOKEN in cmdline for cmdline in services)


def test_a_run_that_starts_its_services_makes_a_token_of_its_own(tiny_lm, arithmetic_data, tmp_path, monkeypatch):
    """No token set: the run makes one for the services it starts, so an anonymous caller on the same
    machine (who could otherwise push weights or load a checkpoint) is refused."""
    monkeypatch.delenv("MESHRL_TOKEN", raising=False)
    monkeypatch.delenv("MESHRL_TOKEN_FILE", raising=False)
    services, code = run_and_probe(tiny_lm, arithmetic_data, tmp_path / "run")
    assert code == grpc.StatusCode.UNAUTHENTICATED and len(services) >= 3
