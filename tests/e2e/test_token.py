"""A run whose environment holds MESHRL_TOKEN: every service it starts requires the token, every client
in the mesh sends it (orchestrator, reward client, the actor's weight push), and it never appears on a
command line; a run without one makes a token of its own for the services it starts, also when another
is given by address, and never sends it to that one."""

import subprocess
from concurrent import futures

import grpc
import psutil
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from meshrl.config.reward import RewardConfig
from meshrl.errors import ServiceError
from meshrl.rpc import Client
from meshrl.rpc.methods import service_handler
from meshrl.v1 import actor_pb2, reward_pb2
from services.reward.servicer import RewardServicer
from testkit.runs import grpo_command

REWARD = reward_pb2.DESCRIPTOR.services_by_name["RewardService"]
ACTOR = actor_pb2.DESCRIPTOR.services_by_name["ActorService"]
TOKEN = "s3cret-token-for-tests"


def run_and_probe(tiny_lm, arithmetic_data, run, role="reward", extra=()) -> tuple[list[str], grpc.StatusCode | None]:
    """A 2-step GRPO run; while it runs, the command lines of its services and what an anonymous
    Describe on its `role` service gets (None: it answered)."""
    proc = subprocess.Popen(
        grpo_command(tiny_lm, arithmetic_data, run, 2, "trainer.save_every=2", *extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    services, out, code = [], [], None
    for line in proc.stdout:  # check the services while they run
        out.append(line)
        if f"started {role} service at" in line:
            address = line.split()[-1].strip()
            services = [" ".join(p.cmdline()) for p in psutil.Process(proc.pid).children(recursive=True)]
            with Client(address, ACTOR if role == "actor" else REWARD, token="", timeout=10, retries=0) as anonymous:
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


class Recorder(grpc.ServerInterceptor):
    """What callers of a stranger's service send as authorization."""

    def __init__(self):
        self.seen = []

    def intercept_service(self, continuation, details):
        self.seen += [v for k, v in details.invocation_metadata if k == "authorization"]
        return continuation(details)


def test_a_given_service_does_not_open_the_runs_own_nor_learn_its_token(
    tiny_lm, arithmetic_data, tmp_path, monkeypatch
):
    """reward.address names someone else's scorer: the actor and rollout this run starts still require the
    run's token (an anonymous Update, PushWeights or LoadCheckpoint is refused), and the scorer is called
    without it."""
    monkeypatch.delenv("MESHRL_TOKEN", raising=False)
    monkeypatch.delenv("MESHRL_TOKEN_FILE", raising=False)
    recorder = Recorder()
    scorer = grpc.server(futures.ThreadPoolExecutor(4), interceptors=[recorder])
    servicer = RewardServicer(RewardConfig(workers=0))
    scorer.add_generic_rpc_handlers((service_handler(servicer, REWARD),))
    checker = health.HealthServicer()
    checker.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(checker, scorer)
    port = scorer.add_insecure_port("127.0.0.1:0")
    scorer.start()
    try:
        _, code = run_and_probe(
            tiny_lm, arithmetic_data, tmp_path / "run", role="actor", extra=[f"reward.address=127.0.0.1:{port}"]
        )
    finally:
        scorer.stop(0)
        servicer.close()
    assert code == grpc.StatusCode.UNAUTHENTICATED
    assert recorder.seen == [], recorder.seen[:3]  # scored the run's samples, never saw its token
