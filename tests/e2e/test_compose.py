"""docker-compose.yml (with docker-compose.fleet.yml: two rollout replicas), run as Docker would run it but
as local processes (compose_local): the prepare job, the actor (2 ranks), ref, rollout and reward
services, and the orchestrator's GRPO run against them through the addresses the file gives. Plus:
the files validate with docker-compose where that tool is installed, and a wrong command fails
clearly instead of hanging."""

import json
import shutil
import subprocess
import sys

import pytest
import yaml
from compose_local import ROOT, ComposeError, LocalCompose

COMPOSE = ROOT / "docker-compose.yml"
FLEET = ROOT / "docker-compose.fleet.yml"


@pytest.mark.slow
def test_the_compose_file_runs_grpo_through_its_services(tmp_path):
    """With docker-compose.fleet.yml on top: two rollout replicas, both used."""
    env = {"SFT_STEPS": "20", "GRPO_STEPS": "2", "ROLLOUT_ADDRESS": "rollout:50053,rollout-2:50053"}
    compose = LocalCompose([COMPOSE, FLEET], tmp_path, env=env)
    assert {"prepare", "actor", "rollout", "rollout-2", "reward", "orchestrator"} <= set(compose.services)
    try:
        code = compose.up(until="orchestrator")
    finally:
        compose.down()
    assert code == 0, compose.log_tail("orchestrator")
    run_dir = tmp_path / "runs" / "default" / "grpo"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert rows[-1]["rollout/replica0/samples"] > 0 and rows[-1]["rollout/replica1/samples"] > 0
    # every service traced into the folder the file names, under the orchestrator's steps
    services = {
        json.loads(line)["service"] for f in (run_dir / "traces").glob("*.jsonl") for line in f.read_text().splitlines()
    }
    assert {"meshrl-orchestrator", "meshrl-actor", "meshrl-rollout", "meshrl-reward"} <= services
    assert (tmp_path / "certs" / "orchestrator" / "orchestrator.pem").is_file()  # it all ran over mutual TLS


def test_a_wrong_command_fails_clearly(tmp_path):
    doc = yaml.safe_load(COMPOSE.read_text())
    doc["services"] = {"reward": doc["services"]["reward"], "orchestrator": doc["services"]["orchestrator"]}
    doc["services"]["reward"]["command"][1] = "serv"  # a typo
    doc["services"]["orchestrator"]["depends_on"] = {"reward": {"condition": "service_healthy"}}
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(yaml.safe_dump(doc))
    compose = LocalCompose(broken, tmp_path)
    try:
        with pytest.raises(ComposeError, match=r"service reward exited with code 2 before it was healthy(.|\n)*serv"):
            compose.up(until="orchestrator", timeout=120)
    finally:
        compose.down()


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose is not installed")
@pytest.mark.parametrize(
    "files",
    [
        ["docker-compose.yml"],
        ["docker-compose.yml", "docker-compose.gpu.yml"],
        ["docker-compose.yml", "docker-compose.fleet.yml"],
    ],
)
def test_docker_compose_validates_the_files(files):
    args = [a for f in files for a in ("-f", str(ROOT / f))]
    result = subprocess.run(["docker-compose", *args, "config", "-q"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_services_come_back_into_the_same_ipc_namespace():
    """Docker restarts a service that dies (the run waits for it); actor and rollout join the IPC namespace
    of a holder that never restarts, so a restarted one still shares /dev/shm with the other."""
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    assert all(services[name].get("restart") == "on-failure" for name in ("actor", "rollout", "reward"))
    assert services["shm"]["ipc"] == "shareable" and "restart" not in services["shm"]
    assert services["actor"]["ipc"] == services["rollout"]["ipc"] == "service:shm"


def test_each_container_holds_only_its_own_roles_key():
    """The reward container runs user code: with every role's key it could present the orchestrator's
    certificate and pass every policy check. Keys live outside the shared runs volume, a folder per role."""
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    role = {"actor": "actor", "rollout": "rollout", "reward": "reward", "orchestrator": "orchestrator"}
    for name, own in role.items():
        mounts = services[name]["volumes"]
        certs = [m for m in mounts if m.split(":")[1] == "/certs"]
        assert certs == [f"./certs/{own}:/certs:ro"], (name, mounts)
        assert not any(m.split(":")[0] in ("./certs", ".") for m in mounts), (name, mounts)
        assert services[name]["environment"]["MESHRL_TLS_DIR"] == "/certs"


def test_certs_per_role_hold_one_key_each(tmp_path):
    subprocess.run([sys.executable, "-m", "cli", "certs", str(tmp_path), "--per-role"], check=True, capture_output=True)
    assert not list(tmp_path.glob("*.key"))  # none left where every container could read them
    for role in ("orchestrator", "actor", "rollout", "reward", "env"):
        assert sorted(p.name for p in (tmp_path / role).iterdir()) == sorted(["ca.pem", f"{role}.pem", f"{role}.key"])
        assert (tmp_path / role / f"{role}.key").stat().st_mode & 0o077 == 0
