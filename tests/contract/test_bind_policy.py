"""Who can reach a service started by hand (issue 27, item 9): a bind beyond loopback without TLS is
refused unless asked for (--insecure-bind or MESHRL_INSECURE_BIND=1), and a loopback service with neither
token nor TLS says at start that any local user can call it."""

import logging
import os
import subprocess
import sys

import pytest

from meshrl.rpc import Client, Server, serve
from meshrl.rpc.server import INSECURE_BIND_VAR, is_loopback
from testkit.echo import SERVICE, EchoScorer


@pytest.fixture
def plain_env(monkeypatch):
    """No TLS, no token, no opt-in, no tracing (its INFO line on stderr), whatever the caller's environment
    holds (another test of the session may have left MESHRL_TRACE set)."""
    for var in ("MESHRL_TLS_DIR", "MESHRL_TOKEN", "MESHRL_TOKEN_FILE", INSECURE_BIND_VAR, "MESHRL_TRACE"):
        monkeypatch.delenv(var, raising=False)
    return {k: v for k, v in os.environ.items()}


@pytest.mark.parametrize("host", ["127.0.0.1", "127.3.2.1", "localhost", "LocalHost", "::1", "[::1]"])
def test_loopback_hosts(host):
    assert is_loopback(host)


@pytest.mark.parametrize(
    "host",
    ["0.0.0.0", "::", "[::]", "", "10.0.0.5", "192.168.1.2", "example.com", "localhost.example.com", "::ffff:10.0.0.1"],
)
def test_hosts_beyond_loopback(host):
    assert not is_loopback(host)


@pytest.mark.parametrize("token", [None, "s3cret"])  # a token alone would travel in clear text
def test_a_bind_beyond_loopback_without_tls_is_refused(plain_env, token):
    with pytest.raises(ValueError, match=r"0\.0\.0\.0 without TLS.*--insecure-bind.*MESHRL_INSECURE_BIND=1"):
        Server([EchoScorer()], host="0.0.0.0", token=token)


def test_the_opt_in_serves_beyond_loopback(plain_env, monkeypatch):
    for kwargs in ({"insecure_bind": True}, {}):
        if not kwargs:
            monkeypatch.setenv(INSECURE_BIND_VAR, "1")
        server = serve(EchoScorer(), host="0.0.0.0", **kwargs)
        try:
            with Client(f"127.0.0.1:{server.port}", SERVICE, timeout=10) as c:
                assert c.call("Describe").backend == "echo"
        finally:
            server.stop(0)


def test_an_open_loopback_service_warns_once(plain_env, caplog):
    with caplog.at_level(logging.WARNING, logger="meshrl.rpc.server"):
        server = serve(EchoScorer())
        server.stop(0)
        closed = serve(EchoScorer(), token="s3cret")
        closed.stop(0)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "any local user can call it" in warnings[0] and "MESHRL_TOKEN" in warnings[0]
    assert server.address in warnings[0]


@pytest.mark.parametrize(
    "service",
    [
        ["reward", "--workers", "0"],  # through run_service
        ["gateway", "--rollout", "127.0.0.1:1", "--model", "unread"],  # checks its bind itself (issue 58, item 16)
    ],
)
def test_meshrl_serve_names_the_flag(plain_env, service):
    cmd = [sys.executable, "-m", "cli", "serve", *service, "--host", "0.0.0.0"]
    env = {**plain_env, "MESHRL_GATEWAY_KEYS": "k"}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 2, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr[-2000:]  # as argparse says a usage error: one line, no traceback
    assert "without TLS" in lines[0] and "--insecure-bind" in lines[0], lines[0]


def test_meshrl_serve_with_the_flag_listens_everywhere(plain_env):
    cmd = [
        sys.executable,
        "-m",
        "cli",
        "serve",
        "reward",
        "--workers",
        "0",
        "--host",
        "0.0.0.0",
        "--insecure-bind",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=plain_env)
    try:
        line = proc.stdout.readline()
        assert "listening on 0.0.0.0:" in line, proc.stderr.read() if proc.poll() is not None else line
    finally:
        proc.terminate()
        proc.wait(30)
