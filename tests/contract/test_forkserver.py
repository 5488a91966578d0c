"""meshrl.forkserver with real processes: a service forked from the server serves, shows its own command
line, sits in a session of its own under the server, takes its environment from the request, and reports
its exit status; signals reach only it; a server that dies takes its children with it, and spawning
afterwards says so instead of hanging."""

import os
import signal
import subprocess

import grpc
import psutil
import pytest

from meshrl import forkserver
from meshrl.errors import ServiceError
from meshrl.rpc import Client
from orchestrator.lifecycle.services import DESCRIPTORS, Services, listening


@pytest.fixture(scope="module")
def server():
    s = forkserver.ForkServer()
    yield s
    s.close()


def test_a_forked_service_serves_and_looks_like_a_started_one(server):
    child = server.spawn(["serve", "reward", "--port", "0"], {**os.environ, "MESHRL_FORK_TEST": "given"})
    try:
        _, address = listening(child, ["reward"])
        client = Client(address, DESCRIPTORS["reward"])
        client.wait_ready(60)
        client.close()
        me = psutil.Process(child.pid)
        assert me.ppid() == server.proc.pid
        assert os.getsid(child.pid) == child.pid  # its own session: Ctrl-C in a terminal does not reach it
        assert "-m cli serve reward" in " ".join(me.cmdline()), me.cmdline()
        assert child.poll() is None
        child.terminate()
        assert child.wait(60) == 0  # the service stops cleanly on SIGTERM, and the server passed that on
        child.kill()  # a signal to an exited child is a no-op, not a stray kill of a recycled pid
    finally:
        child.kill()


def test_exit_codes_come_back_as_subprocess_reports_them(server):
    refused = server.spawn(["health", "127.0.0.1:1", "--timeout", "2"], dict(os.environ))
    usage = server.spawn(["health", "not-an-address"], dict(os.environ))
    assert refused.wait(60) == 1
    assert usage.wait(60) == 2
    lasting = server.spawn(["serve", "reward", "--port", "0"], dict(os.environ))
    with pytest.raises(subprocess.TimeoutExpired):
        lasting.wait(0.01)
    lasting.kill()
    assert lasting.wait(60) == -signal.SIGKILL


def test_the_environment_is_the_requests(server):
    """The server imported with the environment it started with; each child runs with the one it is given
    (a run makes its token, and sets its tracing, after the server has started)."""
    assert "MESHRL_TOKEN" not in os.environ
    child = server.spawn(["serve", "reward", "--port", "0"], {**os.environ, "MESHRL_TOKEN": "tok-for-the-fork"})
    try:
        _, address = listening(child, ["reward"])
        with Client(address, DESCRIPTORS["reward"], token="", timeout=10, retries=0) as anonymous:
            with pytest.raises(ServiceError) as refused:
                anonymous.call("Describe")
        assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED
        with Client(address, DESCRIPTORS["reward"], token="tok-for-the-fork", timeout=10) as ours:
            ours.call("Describe")
    finally:
        child.kill()


def test_children_die_with_a_killed_server_and_later_spawns_fail_fast():
    s = forkserver.ForkServer()
    try:
        child = s.spawn(["serve", "reward", "--port", "0"], dict(os.environ))
        listening(child, ["reward"])
        s.proc.send_signal(signal.SIGKILL)
        assert child.wait(60) == -signal.SIGTERM  # the kernel's lifeline signal, and the handle saw it end
        assert s.gone.wait(10)
        with pytest.raises(OSError):
            s.spawn(["health", "x"], dict(os.environ))
    finally:
        s.close()


def test_a_service_the_server_died_before_forking_is_started_afresh(monkeypatch):
    """A run must not fail because its fork server did: a request still waiting when the server dies gets
    an interpreter of its own (orchestrator.lifecycle.services)."""
    s = forkserver.ForkServer()
    monkeypatch.setattr(forkserver, "_server", s)  # this process's server, as `meshrl <algorithm>` starts it
    services = Services()
    try:
        services.spawn_all({"reward": ("", ["reward", "--port", "0"])})
        assert isinstance(services.spawned["reward"], forkserver.Forked)
        s.proc.send_signal(signal.SIGKILL)  # still importing: nothing was forked
        client = services.start_all({"reward": ("", ["reward", "--port", "0"])})["reward"]
        client.call("Describe")
        proc = services.ours["reward"][0]
        assert isinstance(proc, subprocess.Popen) and services.procs == [proc]
    finally:
        services.stop()
        s.close()
