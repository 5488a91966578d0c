"""The endpoint's sandbox route (meshrl/gateway/sandbox.py) over real HTTP, in front of a real sandbox
service on 127.0.0.1: an episode's key runs programs in a session of its own (a file one call writes is
there for its next call, and no other key sees it), a bad body is a 400 naming the field and the sandbox's
refusal a 400 saying why, and the key's end forgets the session; an endpoint with no sandbox says how to
give it one."""

import json
import urllib.error
import urllib.request

import pytest

from meshrl.config.sandbox import SandboxConfig
from meshrl.gateway.sandbox import Sandboxes
from meshrl.gateway.server import Gateway
from meshrl.rpc import Server
from services.sandbox.servicer import SandboxServicer


class Silent:
    def generate(self, session, ids, n, max_new, request):
        raise AssertionError("the sandbox route generates nothing")


def post(gateway: Gateway, key: str, body) -> tuple[int, dict]:
    request = urllib.request.Request(
        gateway.base_url + "/sandbox/run",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, json.load(reply)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


@pytest.fixture(scope="module")
def sandbox():
    servicer = SandboxServicer(SandboxConfig(concurrency=2, warm=1))
    server = Server([servicer]).start()
    yield servicer, server.address
    server.stop(0)
    servicer.close()


def test_an_episodes_programs_run_in_a_sandbox_session_of_its_own(bpe_tok, sandbox):
    servicer, address = sandbox
    gateway = Gateway(Silent(), bpe_tok, "policy", frozenset([bpe_tok.eos_token_id]), sandbox=Sandboxes(address))
    gateway.start()
    try:
        mine, theirs = gateway.open(), gateway.open()
        write = {"argv": ["python3", "main.py"], "files": {"main.py": "open('notes', 'w').write('kept')\nprint(42)"}}
        assert post(gateway, mine.key, write) == (
            200,
            {
                "exit_code": 0,
                "stdout": "42\n",
                "stderr": "",
                "wall_s": pytest.approx(0.1, abs=10),
                "killed": "",
                "truncated": False,
            },
        )
        read = {"argv": ["cat", "notes"], "return_files": True}
        status, got = post(gateway, mine.key, read)
        assert (status, got["stdout"], sorted(got["files"])) == (200, "kept", ["main.py", "notes"])
        status, other = post(gateway, theirs.key, read)
        assert status == 200 and other["exit_code"] != 0 and "No such file" in other["stderr"]
        status, bad = post(gateway, mine.key, {"argv": "ls"})
        assert status == 400 and bad["error"]["param"] == "argv"
        status, refused = post(gateway, mine.key, {"argv": ["true"], "limits": {"wall_s": 1e9}})
        assert status == 400 and "the sandbox refused the run" in refused["error"]["message"]
        assert post(gateway, "sk-nobody", read)[0] == 401
        sessions = len(servicer.sessions)
        gateway.close(mine.key)  # the episode ends: its session is forgotten, its key refused
        assert len(servicer.sessions) == sessions - 1 and post(gateway, mine.key, read)[0] == 401
    finally:
        gateway.stop()
    bare = Gateway(Silent(), bpe_tok, "policy", frozenset([bpe_tok.eos_token_id])).start()
    try:
        status, none = post(bare, bare.open().key, {"argv": ["true"]})
        assert status == 404 and "rollout.agent_sandbox" in none["error"]["message"]
    finally:
        bare.stop()
