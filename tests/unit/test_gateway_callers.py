"""An episode's key is its agent's alone (issue 58 item 9): a key the run bound to a process is taken only
from that process and those below it (meshrl/gateway/callers.py). Real processes and real loopback
connections: one process calling with its own key is served, another process holding the same key (as one
that read it from /proc/PID/environ would) gets 403, and an unbound key is taken from anyone."""

import socket
import subprocess
import sys
import textwrap

import pytest

from meshrl.gateway import callers
from meshrl.gateway.protocol import Limits
from meshrl.gateway.server import Gateway
from meshrl.gateway.sessions import BINDING, Session

CALL = textwrap.dedent(
    """
    import sys, time, urllib.request, urllib.error
    url, key, wait = sys.argv[1], sys.argv[2], float(sys.argv[3])
    time.sleep(wait)
    request = urllib.request.Request(url, headers={"Authorization": "Bearer " + key})
    try:
        print(urllib.request.urlopen(request, timeout=30).status)
    except urllib.error.HTTPError as e:
        print(e.code)
    """
)


class Silent:
    def generate(self, session, ids, n, max_new, request):
        raise AssertionError("GET /v1/models generates nothing")


@pytest.fixture
def gateway(bpe_tok):
    g = Gateway(Silent(), bpe_tok, "policy", frozenset([bpe_tok.eos_token_id]), limits=Limits(max_model_len=64))
    yield g.start()
    g.stop()


def caller(url: str, key: str, wait: float = 0.0) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CALL, url, key, str(wait)], stdout=subprocess.PIPE, text=True)


def answer(proc: subprocess.Popen) -> int:
    out, _ = proc.communicate(timeout=60)
    return int(out.strip())


def test_a_bound_key_is_taken_from_its_process_alone(gateway):
    url = f"http://{gateway.http.server_address[0]}:{gateway.http.server_address[1]}/v1/models"
    mine, theirs = Session(), Session()
    mine.owner = BINDING
    gateway.open(mine)
    gateway.open(theirs)
    own = caller(url, mine.key, wait=0.5)  # calls once it is bound
    gateway.bind(mine.key, own.pid)
    thief = caller(url, mine.key)  # holds the key, is not the episode's process
    assert answer(own) == 200
    assert answer(thief) == 403
    assert answer(caller(url, theirs.key)) == 200  # an unbound key: any caller


def test_the_socket_table_names_the_process_that_holds_a_connection():
    """calls_from finds a connection's client end in /proc/net/tcp and its holder among a process tree."""
    server = socket.create_server(("127.0.0.1", 0))
    host, port = server.getsockname()
    child = subprocess.Popen(
        [sys.executable, "-c", f"import socket, time; s = socket.create_connection(('{host}', {port})); time.sleep(30)"]
    )
    try:
        conn, peer = server.accept()
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            ends = (peer, (host, port))
            assert callers.socket_inode(*ends) is not None
            assert callers.calls_from(child.pid, *ends)
            assert not callers.calls_from(other.pid, *ends)
            assert callers.socket_inode(peer, (host, port + 1 if port < 65535 else 1)) is None  # another server
        finally:
            other.kill()
        conn.close()
    finally:
        child.kill()
        server.close()
