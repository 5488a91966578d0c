"""A run that heals itself: during a 12-step GRPO run the rollout, the reward service and the actor are
each killed (SIGKILL) at a different step; the orchestrator starts each again (a dead rollout or reward
service costs its step, a dead actor sends the run back to its last checkpoint), and the run finishes by
itself with every step logged once and the same final weights as a run nobody touched."""

import json
import pathlib
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch
from safetensors.torch import load_file

from orchestrator.config import load_config
from orchestrator.main import run
from testkit.runs import chaos_settings, service, steps_logged

KILLS = {3: "rollout", 6: "reward", 9: "actor"}  # after this step is logged, kill that service


def test_killed_services_are_started_again_and_the_run_ends_as_if_untouched(tiny_lm, arithmetic_data, tmp_path):
    chaos, log = tmp_path / "chaos", tmp_path / "chaos.log"
    with open(log, "w") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli", "grpo", *chaos_settings(tiny_lm, arithmetic_data, tmp_path, chaos)],
            stdout=f,
            stderr=f,
        )
    orchestrator, killed, pids, deadline = psutil.Process(proc.pid), [], [], time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < deadline:  # kills as the steps go by
        logged = steps_logged(chaos)
        for step, name in KILLS.items():
            if name not in killed and logged and max(logged) >= step:
                victim = service(orchestrator, name)
                victim.send_signal(signal.SIGKILL)
                killed.append(name)
                pids.append(victim.pid)
        time.sleep(0.05)
    out = log.read_text().splitlines()
    assert proc.wait(60) == 0, "\n".join(out[-40:])
    assert killed == ["rollout", "reward", "actor"]
    assert steps_logged(chaos) == list(range(1, 13))  # every step once, the redone ones too
    last = json.loads((chaos / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["trainer/restarts"] == 3
    assert sum("died: restart" in line for line in out) == 3
    assert any("left by the dead rollout service" in line for line in out)  # its staging segment, removed
    assert not [p for pid in pids for p in pathlib.Path("/dev/shm").glob(f"meshrl*-{pid}-*")]

    whole = run("grpo", load_config(None, chaos_settings(tiny_lm, arithmetic_data, tmp_path, tmp_path / "whole")))
    a = load_file(whole / "checkpoints" / "step_12" / "actor" / "hf" / "model.safetensors")
    b = load_file(chaos / "checkpoints" / "step_12" / "actor" / "hf" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(
        a["model.layers.0.mlp.down_proj.weight"],  # and they did move
        load_file(tiny_lm / "model.safetensors")["model.layers.0.mlp.down_proj.weight"],
    )


@pytest.mark.parametrize("name", ["reward", "actor"])
def test_a_service_given_by_address_is_waited_for(tiny_lm, arithmetic_data, tmp_path, name, monkeypatch):
    """A service the run did not start is not the run's to restart: when it stops answering, the run waits
    for whoever supervises it (here the test, as docker compose's restart policy would). A reward service
    costs the step; an actor comes back with its base weights, so the run loads its last checkpoint (step
    5) into it and redoes the steps after it. The given actor pushes into the run's own rollout, which
    requires the run's token: the user shares one with it (MESHRL_TOKEN)."""
    import socket

    if name == "actor":
        monkeypatch.setenv("MESHRL_TOKEN", "shared-with-the-given-actor")

    from orchestrator.lifecycle.roles import serve_args

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run_dir = tmp_path / "given"
    overrides = [*chaos_settings(tiny_lm, arithmetic_data, tmp_path, run_dir), "trainer.total_steps=8"]
    serve = [
        sys.executable,
        "-m",
        "cli",
        "serve",
        *serve_args(load_config(None, overrides), name),
        "--port",
        str(port),
    ]
    given = subprocess.Popen(serve, stdout=subprocess.DEVNULL)
    log = run_dir.parent / "given.log"
    with open(log, "w") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli", "grpo", *overrides, f"{name}.address=127.0.0.1:{port}"],
            stdout=f,
            stderr=f,
        )
    try:
        deadline = time.monotonic() + 300
        while max(steps_logged(run_dir), default=0) < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
        given.send_signal(signal.SIGKILL)
        given.wait()
        time.sleep(2)  # the run finds it gone and waits
        given = subprocess.Popen(serve, stdout=subprocess.DEVNULL)
        assert proc.wait(300) == 0, log.read_text()[-3000:]
    finally:
        given.terminate()
        given.wait(60)
    assert steps_logged(run_dir) == list(range(1, 9))
    text = log.read_text()
    assert f"{name} not answering" in text and f"waiting up to 300 s for {name}" in text
    assert ("resumed from" in text and "step_5" in text) == (name == "actor")


def test_a_killed_fork_server_is_healed_like_its_services(tiny_lm, arithmetic_data, tmp_path):
    """kill -9 of the run's fork server takes every service it forked with it (meshrl.lifeline); the run
    says so, starts them afresh without it (the actor from the start: no checkpoint yet) and finishes."""
    run_dir, log = tmp_path / "forkless", tmp_path / "forkless.log"
    overrides = [*chaos_settings(tiny_lm, arithmetic_data, tmp_path, run_dir), "trainer.total_steps=4"]
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "cli", "grpo", *overrides], stdout=f, stderr=f)
    orchestrator, deadline = psutil.Process(proc.pid), time.monotonic() + 300
    while max(steps_logged(run_dir), default=0) < 2 and time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        time.sleep(0.05)
    servers = [p for p in orchestrator.children() if "cli.forkserver" in " ".join(p.cmdline())]
    assert len(servers) == 1
    servers[0].send_signal(signal.SIGKILL)
    assert proc.wait(300) == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert "the fork server died, and the services it had started with it" in text
    assert "died: restart 1 of 3" in text
    assert steps_logged(run_dir) == list(range(1, 5))  # every step once, the redone ones too
