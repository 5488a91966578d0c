"""The endpoint's sandbox route: an episode's agent runs programs in the sandbox service (services/sandbox)
through the endpoint and key it talks to the model with, in a sandbox session that lives as long as the key.

    POST /v1/sandbox/run  {"argv": ["python3", "main.py"], "files": {"main.py": "print(6 * 7)"}, "stdin": "",
                           "limits": {"wall_s": 5}, "return_files": false}
    -> {"exit_code": 0, "stdout": "42\n", "stderr": "", "wall_s": 0.02, "killed": "", "truncated": false}

Files, stdin and what comes back are text (UTF-8; bytes that are not come back as U+FFFD). Files one call
writes are there for the key's next call, another key never sees them, and the key's end (a run's
episode ending) forgets them. A bad body is a 400 naming the field, what the sandbox refuses (a limit past
its ceiling, a path outside /work) a 400 with its reason, a sandbox that cannot be reached a 503.
"""

from __future__ import annotations

import hashlib
import logging

from meshrl.errors import ServiceError
from meshrl.gateway.protocol import RequestError
from meshrl.rpc import Client
from meshrl.v1 import sandbox_pb2

log = logging.getLogger(__name__)
SERVICE = sandbox_pb2.DESCRIPTOR.services_by_name["SandboxService"]
LIMITS = {f.name for f in sandbox_pb2.Limits.DESCRIPTOR.fields}
REFUSED = ("INVALID_ARGUMENT", "FAILED_PRECONDITION")  # the request's own doing: the agent's to read


class Sandboxes:
    """Runs for the endpoint's keys in the sandbox service at `address`."""

    def __init__(self, address: str, timeout: float = 660.0):  # the service's longest wall time, and a margin
        self.address = address
        self.client = Client(address, SERVICE, timeout=timeout)

    def run(self, key: str, body) -> dict:
        request = read(body)
        request.session = session_of(key)
        try:
            reply = self.client.call("Run", request)
        except ServiceError as e:
            if e.code.name in REFUSED:
                raise RequestError(f"the sandbox refused the run: {e.details}") from None
            raise RequestError(f"the sandbox could not be reached: {e.details}", status=503) from None
        assert isinstance(reply, sandbox_pb2.RunResponse)  # Run's reply carries no batch
        out = {
            "exit_code": reply.exit_code,
            "stdout": reply.stdout.decode(errors="replace"),
            "stderr": reply.stderr.decode(errors="replace"),
            "wall_s": reply.wall_s,
            "killed": reply.killed,
            "truncated": reply.truncated,
        }
        if request.return_files:
            out["files"] = {name: data.decode(errors="replace") for name, data in reply.files.items()}
        return out

    def close(self, key: str) -> None:
        """The key's session forgotten (its episode ended)."""
        try:
            self.client.call("CloseSession", sandbox_pb2.CloseSessionRequest(session=session_of(key)))
        except ServiceError as e:  # the service is gone: so are its sessions
            log.debug("closing a sandbox session at %s failed: %s", self.address, e)


def session_of(key: str) -> str:
    """The key's sandbox session: named after a hash of the key (the key is a secret; the name is not)."""
    return "gateway-" + hashlib.sha256(key.encode()).hexdigest()[:32]


def read(body) -> sandbox_pb2.RunRequest:
    """The route's body as a RunRequest; RequestError naming the field that is wrong."""
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object")
    argv = body.get("argv")
    if not (isinstance(argv, list) and argv and all(isinstance(a, str) and a for a in argv)):
        raise RequestError("argv must be a list of one or more non-empty strings", "argv")
    files = body.get("files") or {}
    if not (isinstance(files, dict) and all(isinstance(v, str) for v in files.values())):
        raise RequestError("files must map paths to text", "files")
    stdin, back = body.get("stdin") or "", body.get("return_files", False)
    if not isinstance(stdin, str):
        raise RequestError("stdin must be text", "stdin")
    if not isinstance(back, bool):
        raise RequestError("return_files must be true or false", "return_files")
    limits = body.get("limits") or {}
    if not isinstance(limits, dict) or not set(limits) <= LIMITS:
        raise RequestError(f"limits may set {', '.join(sorted(LIMITS))}", "limits")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in limits.values()):
        raise RequestError("limits must be numbers >= 0", "limits")
    request = sandbox_pb2.RunRequest(
        argv=argv, files={k: v.encode() for k, v in files.items()}, stdin=stdin.encode(), return_files=back
    )
    for name, value in limits.items():
        setattr(request.limits, name, value if name.endswith("_s") else int(value))
    return request
