"""The OpenAI-compatible HTTP endpoint: keys, routes, and one call from request body to reply.

    POST /v1/chat/completions   messages (+ tools) rendered with the model's chat template
    POST /v1/completions        a prompt as text or token ids
    POST /v1/responses          the Responses API on the chat path (meshrl/gateway/responses.py)
    POST /v1/sandbox/run        a program run in the sandbox service, in the key's session (gateway/sandbox.py)
    GET  /v1/models             the one model it serves
    GET  /health                200 while it serves

Every /v1 call needs `Authorization: Bearer KEY`, a key the gateway holds a Session for (meshrl/gateway/
sessions.py): a run opens one per episode and closes it when the episode ends; `meshrl serve gateway`
holds the keys it is given. A key reaches its own session only, and a key the run bound to its agent's
process is taken only from that process's connections (meshrl/gateway/callers.py; 403 from any other).
The engine (who generates: the run's rollout fleet, or the rollout services `meshrl serve gateway` was
pointed at) is handed in:

    engine.generate(session, ids, n, max_new, request) -> [(tokens, logprobs, text or None, version)]

Tool calls are read with the run's parser (meshrl/tool_calls.py, rollout.tool_parser), the prompt is
rendered by meshrl/chat.py: the same code the multi-turn path runs. Bad requests get OpenAI's error
object with a 4xx status naming the field (a prompt that leaves no room in the context:
context_length_exceeded; what the rollout itself refuses as invalid: 400 too); a failing engine a 503;
nothing drops the connection.
A stream (`stream: true`) is sent as server-sent events once the turn is whole.
"""

import dataclasses
import http.server
import json
import logging
import threading
import time
from typing import Any, Protocol

from meshrl.errors import ServiceError
from meshrl.gateway import callers, responses
from meshrl.gateway.protocol import (
    MAX_DEPTH,
    Choice,
    Limits,
    Request,
    RequestError,
    chunks,
    completion_id,
    message,
    normal_message,
    read_request,
    reply,
)
from meshrl.gateway.sandbox import Sandboxes
from meshrl.gateway.sessions import BINDING, Session
from meshrl.tool_calls import parser_for

log = logging.getLogger(__name__)

Turn = tuple[list[int], list[float], str | None, int]  # tokens, log-probs, text (None: decode), version
BIND_WAIT_S = 5.0  # a call with a key whose process is starting waits this long for it to be bound
DRAIN = 16  # a body up to this many times the limit is read before its 413 (past it: the connection drops)


class Engine(Protocol):
    def generate(self, session: Session, ids: list[int], n: int, max_new: int, request: Request) -> list[Turn]: ...


class Gateway:
    def __init__(
        self,
        engine: Engine,
        tokenizer,
        model: str,
        ends: frozenset[int],
        *,
        tool_parser: str = "",
        limits: Limits | None = None,
        address: tuple[str, int] = ("127.0.0.1", 0),
        sandbox: Sandboxes | None = None,
    ):
        self.engine, self.tokenizer, self.model, self.ends = engine, tokenizer, model, ends
        self.sandbox = sandbox  # where /v1/sandbox/run runs programs (None: nowhere, a 404)
        self.sandboxed: set[str] = set()  # keys with a sandbox session, forgotten as each closes
        self.parser = parser_for(tool_parser, tokenizer)
        limits = limits or Limits()
        self.limits = dataclasses.replace(limits, vocab_size=limits.vocab_size or len(tokenizer))
        self.sessions: dict[str, Session] = {}
        self.lock = threading.Lock()
        self.http = Listener(address, Handler)
        self.http.gateway = self  # type: ignore[attr-defined]
        self.thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        host, port = self.http.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def start(self) -> "Gateway":
        # a short poll: stop() waits for it (each step of a run starts and stops one)
        self.thread = threading.Thread(target=self.http.serve_forever, args=(0.05,), name="meshrl-gateway", daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        if self.thread is not None:
            self.http.shutdown()
            self.thread.join(10)
        self.http.server_close()

    # ---- keys -----------------------------------------------------------------------------------

    def open(self, session: Session | None = None) -> Session:
        session = session or Session()
        with self.lock:
            self.sessions[session.key] = session
        return session

    def close(self, key: str) -> Session | None:
        """End a key: its calls from now on are refused; its recording is returned."""
        with self.lock:
            session = self.sessions.pop(key, None)
            sandboxed = key in self.sandboxed
            self.sandboxed.discard(key)
        if session is not None:
            with session.lock:
                session.closed = True
        if sandboxed and self.sandbox is not None:
            self.sandbox.close(key)
        return session

    def run_program(self, session: Session, body: Any) -> dict:
        """POST /v1/sandbox/run for the key's session (meshrl/gateway/sandbox.py)."""
        if self.sandbox is None:
            raise RequestError(
                "no sandbox behind this endpoint (a run's rollout.agent_sandbox; meshrl serve gateway --sandbox)",
                status=404,
            )
        with self.lock:
            if session.key not in self.sessions:  # closed while the call waited
                raise RequestError("the API key's episode has ended", status=401, code="invalid_api_key")
            self.sandboxed.add(session.key)
        return self.sandbox.run(session.key, body)

    def session(self, authorization: str | None, ends: tuple | None = None) -> Session:
        """The key's session; a key bound to a process (Session.owner) only from that process's tree, by the
        connection's (client, server) addresses `ends`."""
        scheme, _, key = (authorization or "").strip().partition(" ")
        key = key.strip() if scheme.lower() == "bearer" else ""  # the scheme is case-insensitive (RFC 9110)
        with self.lock:
            session = self.sessions.get(key) if key else None
        if session is None:
            message = "no API key given" if not key else "the API key is not valid (or its episode has ended)"
            raise RequestError(message, status=401, code="invalid_api_key")
        deadline = time.monotonic() + BIND_WAIT_S
        while session.owner == BINDING and time.monotonic() < deadline:  # its process is being started
            time.sleep(0.005)
        if session.owner and not (ends is not None and session.owner > 0 and callers.calls_from(session.owner, *ends)):
            raise RequestError(
                "the API key belongs to another episode's agent: it is taken only from the processes it was given to",
                status=403,
                code="permission_denied",
            )
        return session

    def bind(self, key: str, pid: int) -> None:
        """The key is taken only from process `pid` and those below it from now on."""
        with self.lock:
            session = self.sessions.get(key)
        if session is not None:
            session.owner = pid

    # ---- one call -------------------------------------------------------------------------------

    def complete(self, session: Session, body: Any, chat: bool) -> tuple[Request, dict]:
        request = read_request(body, chat, self.limits)
        plan = session.plan(request, self.tokenizer, self.ends)
        ids = plan.base.prompt + plan.base.tokens
        room = self.limits.max_model_len - len(ids)
        if room <= 0:  # OpenAI's answer; a run's agent decides what its episode does next
            raise RequestError(
                f"the conversation is {len(ids)} tokens; the model takes {self.limits.max_model_len} in all",
                "messages" if chat else "prompt",
                code="context_length_exceeded",
            )
        budget = session.room(plan)
        max_new = min(request.max_tokens or room, room, self.limits.max_tokens or room)
        max_new = max(0, max_new if budget is None else min(max_new, budget))
        turns = self._generate(session, ids, request, max_new) if max_new > 0 else []
        if not turns:  # the episode's token budget is spent: an empty turn that says so
            turns = [([], [], "", 0)] * request.n
        choices = [self._choice(request, t, max_new) for t in turns]
        said = [
            normal_message(c.msg) if chat else (c.text if isinstance(request.prompt, str) else t[0])
            for c, t in zip(choices, turns)
        ]
        session.record(plan, [(t[0], t[1], t[3], s) for t, s in zip(turns, said) if t[0]])
        version = max(t[3] for t in turns)
        return request, reply(request, choices, completion_id(chat), f"meshrl-v{version}", len(ids))

    def _generate(self, session: Session, ids: list[int], request: Request, max_new: int) -> list[Turn]:
        try:
            return self.engine.generate(session, ids, request.n, max_new, request)
        except ServiceError as e:  # what the rollout refused in this request is the caller's, not a failure
            if e.code.name != "INVALID_ARGUMENT":
                raise
            raise RequestError(f"the model refused the request: {e.details}") from None

    def _choice(self, request: Request, turn: Turn, max_new: int) -> Choice:
        tokens, logprobs, text, _ = turn
        if text is None:
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        ended = bool(tokens) and tokens[-1] in self.ends or len(tokens) < max_new
        calls = []
        if request.chat and request.tools and request.parse_tools and self.parser is not None:
            read = self.parser.readable(tokens) if self.parser.special else text
            found = self.parser(read)
            calls = [{"name": c.name, "arguments": c.arguments} for c in found if not c.error]
            if calls and len(calls) == len(found):
                text = self.parser.content(read)
        finish = "tool_calls" if calls else "stop" if ended else "length"
        pieces = [self.tokenizer.decode([t]) for t in tokens] if request.logprobs else []
        choice = Choice(text, pieces, list(logprobs) if request.logprobs else [], finish, calls, count=len(tokens))
        choice.msg = message(choice)
        return choice


class Listener(http.server.ThreadingHTTPServer):
    request_queue_size = 1024  # hundreds of episodes connect at once; the default backlog (5) refuses them
    daemon_threads = True  # a hung agent's connection must not hold the process at exit


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the OpenAI SDK's client expects
    disable_nagle_algorithm = True  # headers and body go out as two writes: Nagle held the body 40 ms
    timeout = 600  # seconds an idle keep-alive connection holds its thread
    server_version = "meshrl-gateway"

    @property
    def gateway(self) -> Gateway:
        return self.server.gateway  # type: ignore[attr-defined]

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the base class's name
        log.debug("%s %s", self.address_string(), format % args)

    def _ends(self) -> tuple:
        """This connection's (client, server) addresses."""
        return self.client_address, self.connection.getsockname()

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        path = self.path.split("?")[0].rstrip("/")
        if path in ("/health", "/v1/health"):
            return self._json(200, {"status": "ok"})
        try:
            self.gateway.session(self.headers.get("Authorization"), self._ends())
            model = {"id": self.gateway.model, "object": "model", "created": 0, "owned_by": "meshrl"}
            if path == "/v1/models":
                return self._json(200, {"object": "list", "data": [model]})
            if path == f"/v1/models/{self.gateway.model}":
                return self._json(200, model)
            raise RequestError(f"no route GET {path}", status=404)
        except RequestError as e:
            self._json(e.status, e.body())

    def do_POST(self) -> None:  # noqa: N802
        path = self.path.split("?")[0].rstrip("/")
        try:
            body = self._body()
            if path not in ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/sandbox/run"):
                raise RequestError(f"no route POST {path}", status=404)
            session = self.gateway.session(self.headers.get("Authorization"), self._ends())
            if path == "/v1/sandbox/run":
                return self._json(200, self.gateway.run_program(session, body))
            if path == "/v1/responses":  # the chat path's, asked and answered in the Responses API's shapes
                _, whole = self.gateway.complete(session, responses.chat_body(body), True)
                return self._response(body, responses.response(body, whole))
            request, whole = self.gateway.complete(session, body, path == "/v1/chat/completions")
        except RequestError as e:
            return self._json(e.status, e.body())
        except Exception as e:  # noqa: BLE001 - the engine's failure: the agent gets an answer, not a drop
            log.warning("a gateway call failed: %s: %s", type(e).__name__, e)
            error = RequestError(f"the model could not answer: {type(e).__name__}: {e}", status=503)
            return self._json(503, error.body())
        if not request.stream:
            return self._json(200, whole)
        self._events()
        for chunk in chunks(request, whole):
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")

    def _response(self, body: dict, whole: dict) -> None:
        if not body.get("stream"):
            return self._json(200, whole)
        self._events()
        for kind, data in responses.events(whole):
            self.wfile.write(responses.sse(kind, data))

    def _events(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

    def do_PUT(self) -> None:  # noqa: N802
        self._refuse()

    do_DELETE = do_PATCH = do_PUT

    def _refuse(self) -> None:
        try:
            self._body(discard=True)
            raise RequestError(f"{self.command} is not served here", status=405)
        except RequestError as e:
            self._json(e.status, e.body())

    def _body(self, discard: bool = False) -> Any:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True  # its bytes are left unread: the connection cannot be reused
            raise RequestError("a chunked body is not read here: send Content-Length", status=411)
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        limit = self.gateway.limits.max_body_bytes
        if length < 0 or length > limit:
            self.close_connection = True  # what is left unread makes the connection unusable
            if 0 < length <= DRAIN * limit:  # read it, so that a client still sending sees the 413
                self._drain(length)
            raise RequestError(f"the body may be at most {limit} bytes", status=413)
        data = self.rfile.read(length)
        if discard:
            return None
        try:
            return json.loads(data or b"null")
        except ValueError as e:
            raise RequestError(f"the body is not JSON: {e}") from None
        except RecursionError:
            raise RequestError(f"the body nests deeper than {MAX_DEPTH} levels") from None

    def _drain(self, length: int) -> None:
        while length > 0:
            got = self.rfile.read(min(length, 1 << 20))
            if not got:
                return
            length -= len(got)

    def _json(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
