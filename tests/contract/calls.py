"""What the contract tests call services with: expect (a call refused with a code and a message), an HF
rollout served in this process (serve), chat prompts, a Generate call, and the tiny model's weights as a
push sends them, wait_until, and `meshrl serve gateway` in front of rollouts (served_gateway). The
fixtures built from these are in conftest.py."""

import contextlib
import os
import subprocess
import sys
import time

import pytest
from safetensors.torch import load_file

from meshrl.codec import Payload
from meshrl.config.rollout import RolloutConfig
from meshrl.dataproto import DataProto
from meshrl.errors import ServiceError
from meshrl.rpc import Client, Server
from meshrl.v1 import rollout_pb2
from services.rollout.servicer import RolloutServicer

ROLLOUT = rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"]


def expect(code, fn, match):
    """fn() is refused with `code`, and the refusal's details say `match`."""
    with pytest.raises(ServiceError) as e:
        fn()
    assert e.value.code == code, e.value
    assert match in e.value.details, e.value.details


def serve(model_dir, **settings):
    """(servicer, server, client) of an HF rollout in this process; the caller stops and closes them."""
    servicer = RolloutServicer(
        RolloutConfig(**{"model": str(model_dir), "backend": "hf", "max_model_len": 64, **settings})
    )
    server = Server([servicer]).start()
    return servicer, server, Client(server.address, ROLLOUT, timeout=120)


def chats(*questions):
    return DataProto(
        non_tensor_batch={
            "prompt": [[{"role": "user", "content": q}] for q in questions],
            "uid": [f"u{i}" for i in range(len(questions))],
        }
    )


def generate(client, data, **sampling):
    sampling = {"n": 1, "temperature": 1.0, "max_new_tokens": 8, "logprobs": True, **sampling}
    return client.call(
        "Generate", Payload(rollout_pb2.GenerateRequest(sampling=rollout_pb2.SamplingParams(**sampling)), data)
    )


def current_weights(tiny_lm, scale=1.0):
    return {k: v * scale for k, v in load_file(tiny_lm / "model.safetensors").items()}


def wait_until(condition, seconds=60):
    """Polls condition() until it holds; fails the test past `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.002)


@contextlib.contextmanager
def served_gateway(addresses: str, model, keys: str):
    """`meshrl serve gateway` in front of the rollouts at `addresses` (MESHRL_GATEWAY_KEYS=keys) on a free
    port, as a user starts it: its base URL; it must stop cleanly on SIGTERM."""
    env = {**os.environ, "MESHRL_GATEWAY_KEYS": keys}
    command = [sys.executable, "-m", "cli", "serve", "gateway", "--rollout", addresses, "--model", str(model)]
    proc = subprocess.Popen([*command, "--port", "0"], stdout=subprocess.PIPE, env=env, text=True)
    line = proc.stdout.readline()
    assert "meshrl gateway: http://" in line, line
    yield line.split()[2]
    proc.terminate()
    assert proc.wait(30) == 0
