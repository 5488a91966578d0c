"""An environment whose tools run code: `python` and `bash`, each call run in the sandbox service
(services/sandbox) in a session that lives as long as the episode, so files one call writes are there for
the next. The sandbox's address is MESHRL_SANDBOX (the env service's environment, as the reward service's
workers have it).

    meshrl serve env --module services.env.code_tools:CodeTools

In the text protocol the policy writes a ```python or ```bash block and ends its turn there (STOP); the
block's output comes back in a ```output block. In the model's own tool format (rollout.tool_parser) the
tools are TOOLS: python {"code"} and bash {"command"}. A turn without a call ends the episode with reward 0:
the answer is the reward service's to score (env.reward=service). A call's output is its stdout, then its
stderr, and a line saying why it ended when it did not end 0 (exit code, or the sandbox's time or output
limit); a sandbox that cannot be reached raises, and the episode is lost rather than scored.
"""

from __future__ import annotations

import re
import uuid

import grpc

from meshrl.clients import sandbox
from meshrl.errors import ServiceError
from meshrl.v1 import sandbox_pb2

BLOCK = re.compile(r"```(python|bash)[ \t]*\n(.*?)(?:```|$)", re.S)
STOPPED = {"wall": "time", "output": "output", "memory": "memory"}  # the sandbox's `killed`
OUTPUT_CHARS = 2000  # of a call's output, what the policy sees
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "python",
            "description": "Run a Python program; its output comes back. Files persist for the episode.",
            "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command; its output comes back. Files persist for the episode.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
        },
    },
]


class CodeTools:
    STOP = ["```\n"]  # the end of a code block: a turn ends with its call (the opening fence has a language)
    TOOLS = TOOLS

    def reset(self, task: dict, seed: int | None = None) -> str:
        self.session, self.calls = uuid.uuid4().hex, 0
        sandbox.sandbox()  # RuntimeError naming MESHRL_SANDBOX where the env service has none
        return ""

    def call(self, name: str, arguments: dict) -> str:
        if name == "python" and isinstance(arguments.get("code"), str):
            return self.run(["python3", "main.py"], arguments["code"])
        if name == "bash" and isinstance(arguments.get("command"), str):
            return self.run(["bash", "main.sh"], arguments["command"])
        return f'error: the tools are python {{"code"}} and bash {{"command"}}, got {name!r} {arguments!r:.60}'

    def run(self, argv: list[str], text: str) -> str:
        """One call in the episode's sandbox session: what it printed, and why it ended if not 0."""
        self.calls += 1
        request = sandbox_pb2.RunRequest(argv=argv, files={argv[1]: text.encode()}, session=self.session)
        try:
            reply = sandbox.run(request)
        except ServiceError as e:
            if e.code not in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION):
                raise  # the sandbox is not there: the episode is lost, not scored
            return f"error: {e.details}"  # its own doing (a full /work, too many files): the policy's to read
        out = (reply.stdout + reply.stderr).decode(errors="replace")[-OUTPUT_CHARS:]
        if reply.killed:
            out += f"\n[stopped: past its {STOPPED.get(reply.killed, reply.killed)} limit]"
        elif reply.exit_code:
            out += f"\n[exit code {reply.exit_code}]"
        return out

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        blocks = BLOCK.findall(action)
        if not blocks:
            return "", 0.0, True, {"tool_calls": self.calls}
        kind, text = blocks[-1]  # the turn ends at its call: the last block is it
        out = self.call(kind, {"code": text} if kind == "python" else {"command": text})
        return f"```output\n{out}\n```\n", 0.0, False, {"tool": kind}

    def close(self) -> None:
        sandbox.close_session(self.session)
