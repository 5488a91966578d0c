"""docker-compose.yml under a real Docker engine: the image built (scripts/docker_build.sh: a base from
Debian's packages, for engines that cannot pull from Docker Hub), `docker-compose up` through prepare,
the healthchecks and a short GRPO run to its end over mutual TLS; each container holds its own role's
key only; a rollout container that crashes mid-run is restarted by Docker's restart policy, gets the
actor's weights, and the run finishes.

Skipped where no Docker engine answers (`docker info`), Debian's `docker-compose` (v1) is missing, or the
test does not run as root: it crashes a container by killing its process from the host, since Docker
restarts no container after `docker kill` (that counts as a manual stop). Figures: docs/deploy.md.
    .venv/bin/pytest tests/e2e/test_docker.py -m docker -s      # prints its timings
Each test brings up its own compose project (own name, folder, network and volume) in its tmp_path.
"""

import itertools
import json
import os
import shutil
import signal
import subprocess
import time

import pytest
from compose_local import ROOT

FIGURES = {}
PROJECTS = itertools.count()


def docker_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode == 0


pytestmark = [
    pytest.mark.docker,
    pytest.mark.slow,
    pytest.mark.timeout(1800),  # a first image build downloads ~4 GB of packages
    pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose is not installed"),
    pytest.mark.skipif(os.geteuid() != 0, reason="crashing a container from the host needs root"),
    pytest.mark.skipif(not docker_answers(), reason="no Docker engine answers `docker info`"),
]


@pytest.fixture(scope="module")
def image():
    """meshrl:latest (the image docker-compose.yml names), built from this checkout."""
    t = time.monotonic()
    subprocess.run(
        ["bash", str(ROOT / "scripts" / "docker_build.sh")],
        check=True,
        cwd=ROOT,
        timeout=1700,
        stdout=subprocess.DEVNULL,
    )
    FIGURES["build_s"] = time.monotonic() - t
    yield "meshrl:latest"
    print("\ndocker compose figures (s):", {k: round(v, 1) if isinstance(v, float) else v for k, v in FIGURES.items()})


class Compose:
    def __init__(self, project_dir, env):
        self.name = f"meshrltest{os.getpid()}x{next(PROJECTS)}"
        self.dir = project_dir
        self.base = [
            "docker-compose",
            "-p",
            self.name,
            "--project-directory",
            str(project_dir),
            "-f",
            str(ROOT / "docker-compose.yml"),
        ]
        self.env = {**os.environ, **env}
        self.run_dir = project_dir / "runs" / "default" / "grpo"

    def __call__(self, *args, timeout=600, check=True) -> str:
        result = subprocess.run([*self.base, *args], env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"docker-compose {' '.join(args)}: rc {result.returncode}\n{result.stderr[-3000:]}")
        return result.stdout

    def container(self, service: str) -> str:
        return f"{self.name}_{service}_1"

    def inspect(self, service: str, fmt: str) -> str:
        return subprocess.run(
            ["docker", "inspect", "-f", fmt, self.container(service)], capture_output=True, text=True, check=True
        ).stdout.strip()

    def logs(self, service: str) -> str:
        log = subprocess.run(
            ["docker", "logs", self.container(service)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        ).stdout
        (self.dir / f"{service}.log").write_text(log)
        return log

    def crash(self, service: str) -> float:
        """Kill the service's process from outside (a crash, as Docker sees one); when it was killed."""
        os.kill(int(self.inspect(service, "{{.State.Pid}}")), signal.SIGKILL)
        return time.monotonic()

    def wait_exit(self, service: str, timeout: float = 900) -> int:
        return int(
            subprocess.run(
                ["docker", "wait", self.container(service)], capture_output=True, text=True, timeout=timeout, check=True
            ).stdout.strip()
        )

    def steps(self) -> list[int]:
        try:
            return [json.loads(line)["step"] for line in (self.run_dir / "metrics.jsonl").read_text().splitlines()]
        except (FileNotFoundError, json.JSONDecodeError):  # not yet, or a line half written
            return []

    def wait_step(self, step: int, timeout: float = 300) -> None:
        wait_for(f"step {step} logged", lambda: max(self.steps(), default=-1) >= step, timeout)


def wait_for(what, predicate, timeout, every=0.25):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"{what}: not after {timeout:.0f} s")


@pytest.fixture
def compose(image, tmp_path):
    made = []

    def up(grpo_steps: int) -> Compose:
        c = Compose(tmp_path, {"SFT_STEPS": "20", "GRPO_STEPS": str(grpo_steps)})
        made.append(c)
        t = time.monotonic()
        c("up", "-d", "--no-build")  # returns once prepare is done and the services are healthy
        FIGURES.setdefault("up_s", time.monotonic() - t)
        return c

    yield up
    for c in made:
        c("down", "-v", "--remove-orphans", timeout=300, check=False)


def warnings(log: str) -> str:
    return "\n".join(line for line in log.replace("\r", "\n").splitlines() if "WARNING" in line or "error" in line)


ROLLOUT_VERSION = """
from meshrl import tls
from meshrl.v1 import common_pb2, rollout_pb2_grpc
tls.set_role(tls.folder_role())
with tls.channel("127.0.0.1:50053", None, []) as channel:
    info = rollout_pb2_grpc.RolloutServiceStub(channel).Describe(common_pb2.DescribeRequest(), timeout=30)
print(info.weight_version)
"""


def test_compose_runs_grpo_under_docker_and_heals_a_crashed_rollout(compose):
    steps = 12
    c = compose(steps)
    t = time.monotonic()
    for service in ("actor", "rollout", "reward"):
        assert c.inspect(service, "{{.HostConfig.RestartPolicy.Name}} {{.State.Health.Status}}") == "on-failure healthy"

    c.wait_step(3)
    killed = c.crash("rollout")
    wait_for("the rollout restarted", lambda: c.inspect("rollout", "{{.RestartCount}}") == "1", 120)
    FIGURES["rollout_restarted_s"] = time.monotonic() - killed
    wait_for("the rollout healthy again", lambda: c.inspect("rollout", "{{.State.Health.Status}}") == "healthy", 300)
    FIGURES["rollout_healthy_again_s"] = time.monotonic() - killed

    code = c.wait_exit("orchestrator")
    FIGURES["run_s"] = time.monotonic() - t
    log = c.logs("orchestrator")
    assert code == 0, warnings(log) + log[-3000:]
    assert c.steps() == list(range(steps + 1))  # each step once, a retried one too
    assert (c.run_dir / "summary.md").is_file()
    # The new rollout holds the actor's last weights. Two ways lead there, by where the crash falls: a
    # Generate fails, the run waits for the rollout and pushes again (orchestrator/run/recovery.py); or the
    # actor's push into it fails and the actor tries again until it answers (one step's push taking longer).
    assert int(c("exec", "-T", "rollout", "python", "-c", ROLLOUT_VERSION)) == steps
    FIGURES["healed_by"] = "the run's recovery" if "rollout not answering" in warnings(log) else "the actor's push"

    # each container holds its own role's key and no other (./certs/ROLE mounted at /certs)
    for role in ("actor", "rollout", "reward"):
        assert c("exec", "-T", role, "ls", "/certs").split() == sorted(["ca.pem", f"{role}.pem", f"{role}.key"])
    assert c("run", "--rm", "--no-deps", "-T", "orchestrator", "ls", "/certs").split() == [
        "ca.pem",
        "orchestrator.key",
        "orchestrator.pem",
    ]


def test_compose_heals_a_crashed_actor_from_the_last_checkpoint(compose):
    """Docker restarts the actor; the run goes back to its last checkpoint, loads it into the new actor and
    pushes the checkpoint's weights into the rollout, which is ahead of them (it kept the newer ones) and
    takes them as a rollback (this failed before: 'weight version 10 is not newer than ... (11)')."""
    steps = 14  # trainer.save_every=10: a checkpoint after step 10
    c = compose(steps)
    c.wait_step(11)  # killed in step 12
    killed = c.crash("actor")
    wait_for("the actor restarted", lambda: c.inspect("actor", "{{.RestartCount}}") == "1", 120)
    wait_for("the actor healthy again", lambda: c.inspect("actor", "{{.State.Health.Status}}") == "healthy", 300)
    FIGURES["actor_healthy_again_s"] = time.monotonic() - killed
    code = c.wait_exit("orchestrator")
    log = c.logs("orchestrator")
    assert code == 0, warnings(log)[-3000:]
    assert c.steps() == list(range(steps + 1))
