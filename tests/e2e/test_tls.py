"""Mutual TLS with a certificate per role (`meshrl certs`, MESHRL_TLS_DIR): a plain or certificate-less
caller is turned away, a server whose certificate names another role is not trusted, a role calls only
what POLICY lets it, and a whole GRPO run (orchestrator, actor's weight push, rollout, reward) trains
over it."""

import json
import os
import stat
import subprocess
import sys

import grpc
import pytest
import torch

from meshrl import tls
from meshrl.codec import Payload
from meshrl.dataproto import DataProto
from meshrl.errors import ServiceError
from meshrl.rpc import Client
from meshrl.rpc.server import Server
from meshrl.v1 import reward_pb2, rollout_pb2
from testkit.echo import EchoScorer
from testkit.runs import grpo_command

REWARD = reward_pb2.DESCRIPTOR.services_by_name["RewardService"]
ROLLOUT = rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"]


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    out = tmp_path_factory.mktemp("certs")
    done = subprocess.run([sys.executable, "-m", "cli", "certs", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["ca.pem", *(f"{r}.{x}" for r in tls.ROLES for x in ("pem", "key"))]
    )  # no CA key left lying about
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in out.glob("*.key"))
    return out


@pytest.fixture
def tls_on(certs, monkeypatch):
    monkeypatch.setenv(tls.VAR, str(certs))
    return certs


def score(client):
    return client.call("Score", Payload(reward_pb2.ScoreRequest(), DataProto({"x": torch.ones(2, 3)})))


def test_roles_callers_and_servers_are_checked(tls_on, monkeypatch):
    server = Server([EchoScorer()]).start()
    try:
        with Client(server.address, REWARD, timeout=10) as c:  # the orchestrator's certificate
            assert score(c).data.batch["scores"].tolist() == [3.0, 3.0]
        monkeypatch.setattr(tls, "_role", "rollout")
        with Client(server.address, REWARD, timeout=10) as c:
            with pytest.raises(ServiceError) as e:
                score(c)
            assert e.value.code == grpc.StatusCode.PERMISSION_DENIED
            assert "the rollout role may not call" in e.value.details
            assert c.call("Describe").backend == "echo"  # any role of the mesh may look
        monkeypatch.setattr(tls, "_role", "actor")
        with Client(server.address, ROLLOUT, timeout=5, retries=0) as c:  # a "rollout" with the reward's certificate
            with pytest.raises(ServiceError) as e:
                c.call("Describe")
            assert e.value.code == grpc.StatusCode.UNAVAILABLE  # the handshake fails: no weights go there
        monkeypatch.delenv(tls.VAR)
        with Client(server.address, REWARD, timeout=5, retries=0) as c:  # plain TCP
            with pytest.raises(ServiceError) as e:
                c.call("Describe")
            assert e.value.code == grpc.StatusCode.UNAVAILABLE
        ca = (tls_on / "ca.pem").read_bytes()
        with grpc.secure_channel(
            server.address, grpc.ssl_channel_credentials(ca), options=[("grpc.ssl_target_name_override", "reward")]
        ) as ch:  # TLS without a client certificate
            with pytest.raises(grpc.RpcError) as e:
                ch.unary_unary("/meshrl.v1.RewardService/Describe")(b"", timeout=5)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        env = {**os.environ, tls.VAR: str(tls_on)}
        health = subprocess.run(
            [sys.executable, "-m", "cli", "health", server.address], env=env, capture_output=True, text=True
        )
        assert health.returncode == 0 and "SERVING" in health.stdout, health.stderr
    finally:
        server.stop(0)


def test_a_grpo_run_trains_over_mutual_tls(tls_on, tiny_lm, arithmetic_data, tmp_path):
    """Two rollout replicas and the stream transport: the actor's push goes down a chain, the first
    replica passing each bucket on to the second (a rollout calling a rollout, under the policy)."""
    run = tmp_path / "run"
    done = subprocess.run(
        grpo_command(tiny_lm, arithmetic_data, run, 2, "rollout.replicas=2", "rollout.weight_transport=stream"),
        env={**os.environ, tls.VAR: str(tls_on)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in steps] == [1, 2]
    assert steps[-1]["rollout/kl_to_actor"] < 1e-4  # the actor's push reached the rollout over TLS
    assert steps[-1]["rollout/replica1/weight_version"] == steps[-1]["rollout/replica0/weight_version"]
    assert "a weight relay missed" not in done.stderr  # the second replica got it from the first
