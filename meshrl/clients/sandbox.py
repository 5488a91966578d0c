"""The sandbox service's client, as code that runs programs uses it (the built-in code scorer, the code
tools environment): the service named by MESHRL_SANDBOX (HOST:PORT), one client a process, and Run's
reply typed."""

from __future__ import annotations

import os

from meshrl.rpc import Client
from meshrl.v1 import sandbox_pb2

VAR = "MESHRL_SANDBOX"  # set by the reward service from --sandbox; by hand for the env service
CODE_SOURCES = ("code", "apps", "codecontests", "codeforces", "taco")  # the built-in code scorer's (verl's names)
_client: Client | None = None


def sandbox() -> Client:
    """The client of the sandbox service MESHRL_SANDBOX names; RuntimeError when none is named."""
    global _client
    address = os.environ.get(VAR, "")
    if not address:
        raise RuntimeError(f"no sandbox service: start one (meshrl serve sandbox) and set {VAR}=HOST:PORT")
    if _client is None or _client.address != address:
        _client = Client(address, sandbox_pb2.DESCRIPTOR.services_by_name["SandboxService"], timeout=120)
    return _client


def run(request: sandbox_pb2.RunRequest) -> sandbox_pb2.RunResponse:
    reply = sandbox().call("Run", request)
    assert isinstance(reply, sandbox_pb2.RunResponse)  # a Run reply carries no batch
    return reply


def close_session(session: str) -> None:
    sandbox().call("CloseSession", sandbox_pb2.CloseSessionRequest(session=session))
