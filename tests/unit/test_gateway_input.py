"""The endpoint's answers to what clients get wrong (issue 58 items 2, 3, 11): every client mistake is a
400 naming the field, checked before the engine is called (the engine here raises on anything the
rollout would refuse, so a mistake that reaches it shows as a 503); an absent or huge max_tokens is the
room left in the context; a body over the limit is read before its 413; the Bearer scheme in any case.
A seeded fuzz of 3,000 bodies gets no 5xx."""

import http.client
import json
import random
import socket

import pytest

from meshrl.errors import ServiceError
from meshrl.gateway.protocol import Limits
from meshrl.gateway.server import Gateway

LIMIT = 64  # the context the engine takes


class Strict:
    """Answers with one token per new token allowed; raises, as the rollout would fail, on anything a
    gateway should have refused: an id outside the vocabulary, a prompt past the context, a seed outside
    the proto's uint64, a stop string the hf rollout would search for seconds."""

    def __init__(self, vocab: int, refuse: bool = False):
        self.vocab, self.refuse, self.asked = vocab, refuse, []

    def generate(self, session, ids, n, max_new, request):
        self.asked.append(max_new)
        if self.refuse:
            import grpc

            raise ServiceError("127.0.0.1:1", "Generate", grpc.StatusCode.INVALID_ARGUMENT, "row 0: too long")
        if any(not 0 <= t < self.vocab for t in ids) or len(ids) + max_new > LIMIT or max_new < 1:
            raise RuntimeError(f"the rollout refused ids or lengths: {len(ids)} + {max_new}")
        if request.seed is not None and not 0 <= request.seed < 2**64 - 16:
            raise ValueError("Value out of range")
        if any(len(s) > 1000 for s in request.stop):
            raise RuntimeError("a stop string the hf rollout would search for a long time")
        return [([5] * max_new, [-0.1] * max_new, "x" * max_new, 1)] * n


@pytest.fixture(scope="module")
def tok(bpe_tok):
    return bpe_tok


@pytest.fixture
def gateway(tok):
    g = Gateway(Strict(len(tok)), tok, "policy", frozenset([tok.eos_token_id]), limits=Limits(max_model_len=LIMIT))
    yield g.start()
    g.stop()


def post(g: Gateway, body: bytes, key: str, path: str = "/v1/chat/completions", scheme: str = "Bearer"):
    conn = http.client.HTTPConnection(*g.http.server_address[:2], timeout=30)
    conn.request("POST", path, body=body, headers={"Authorization": f"{scheme} {key}"})
    r = conn.getresponse()
    data = r.read()
    return r.status, json.loads(data or b"{}") if r.getheader("Content-Type") == "application/json" else {}


def chat(**extra) -> dict:
    return {"model": "p", "messages": [{"role": "user", "content": "2+2="}], **extra}


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


BAD = [  # (path, body as JSON text, the field named)
    ("/v1/completions", json.dumps({"model": "p", "prompt": [1, 10**6]}), "prompt"),  # outside the vocabulary
    ("/v1/completions", json.dumps({"model": "p", "prompt": [1, -3]}), "prompt"),
    ("/v1/completions", json.dumps({"model": "p", "prompt": [5] * LIMIT}), "prompt"),  # no room left
    ("/v1/chat/completions", json.dumps(chat(seed=2**70)), "seed"),
    ("/v1/chat/completions", json.dumps(chat(seed=-1)), "seed"),
    ("/v1/chat/completions", json.dumps(chat(stop=["x" * 400_000])), "stop"),
    (
        "/v1/chat/completions",
        '{"model": "p", "messages": [{"role": "user", "content": "\\ud800"}]}',
        "messages[0].content",
    ),
    (
        "/v1/chat/completions",
        '{"model": "p", "messages": [{"role": "user", "content": "x"}], "x": ' + nested(40) + "}",
        "x" + "[0]" * 32,
    ),
    (
        "/v1/chat/completions",
        '{"model": "p", "messages": ' + nested(100_000) + "}",
        None,
    ),  # past the parser's recursion
]


@pytest.mark.parametrize("path,body,field", BAD)
def test_client_mistakes_are_400s_naming_the_field_before_the_engine(gateway, path, body, field):
    s = gateway.open()
    status, reply = post(gateway, body.encode(), s.key, path)
    assert status == 400 and reply["error"]["param"] == field, reply
    assert not gateway.engine.asked and not s.samples


def test_no_room_is_context_length_exceeded_on_a_runs_session_too(gateway):
    from meshrl.gateway.sessions import Session

    s = gateway.open(Session(budget=100))
    status, reply = post(gateway, json.dumps({"model": "p", "prompt": [5] * LIMIT}).encode(), s.key, "/v1/completions")
    assert status == 400 and reply["error"]["code"] == "context_length_exceeded"


def test_an_absent_or_huge_max_tokens_is_the_room_left(gateway):
    s = gateway.open()
    for extra in ({}, {"max_tokens": 10**9}, {"max_completion_tokens": 10**9}):
        status, reply = post(
            gateway, json.dumps({"model": "p", "prompt": [5] * 50, **extra}).encode(), s.key, "/v1/completions"
        )
        assert status == 200 and reply["usage"]["completion_tokens"] == LIMIT - 50, reply
    gateway.limits.max_tokens = 4  # a cap (a run's rollout.max_new_tokens) still holds
    assert (
        post(gateway, json.dumps({"model": "p", "prompt": [5] * 50}).encode(), s.key, "/v1/completions")[1]["usage"][
            "completion_tokens"
        ]
        == 4
    )


def test_what_the_rollout_refuses_as_invalid_is_a_400(tok):
    g = Gateway(Strict(len(tok), refuse=True), tok, "policy", frozenset([tok.eos_token_id])).start()
    try:
        s = g.open()
        status, reply = post(g, json.dumps(chat()).encode(), s.key)
        assert status == 400 and "too long" in reply["error"]["message"]
    finally:
        g.stop()


def test_bearer_in_any_case_and_an_oversized_body_read_before_its_413(gateway):
    s = gateway.open()
    assert post(gateway, json.dumps(chat()).encode(), s.key, scheme="bearer")[0] == 200
    assert post(gateway, json.dumps(chat()).encode(), s.key, scheme="BEARER")[0] == 200
    gateway.limits.max_body_bytes = 1 << 20
    body = b"{" + b" " * (5 << 20) + b"}"  # 5 MiB: a client sending it whole must read the 413, not a broken pipe
    with socket.create_connection(gateway.http.server_address[:2], timeout=30) as sock:
        head = f"POST /v1/chat/completions HTTP/1.1\r\nAuthorization: Bearer {s.key}\r\n"
        sock.sendall(
            f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body
        )  # raises BrokenPipeError / ConnectionResetError if unread
        assert sock.recv(64).startswith(b"HTTP/1.1 413")


HOSTILE = [None, True, -1, 0, 1, 2**70, -(2**70), 1e9, 0.5, float("nan"), "", "x", "\ud800", "x" * 5000, [], [1, -1],
           [10**7], {}, {"a": []}, [[[[]]]], ["\udfff"], [""], {"type": "json_schema"}]  # fmt: skip
FIELDS = ["model", "messages", "prompt", "n", "max_tokens", "max_completion_tokens", "temperature", "top_p",
          "stop", "seed", "logprobs", "stream", "tools", "tool_choice", "response_format", "stream_options",
          "top_logprobs", "echo"]  # fmt: skip


def mutate(rng: random.Random) -> tuple[str, str]:
    completions = rng.random() < 0.4
    body: dict = {"model": "p", "prompt": [5, 6, 7]} if completions else chat()
    for _ in range(rng.randint(1, 3)):
        field = rng.choice(FIELDS)
        value = rng.choice(HOSTILE)
        if field == "messages" and rng.random() < 0.5:
            value = [{"role": rng.choice(["user", "tool", "x"]), "content": value}]
        body[field] = value
    text = json.dumps(body, allow_nan=True)
    return ("/v1/completions" if completions else "/v1/chat/completions"), text


def test_a_fuzz_of_3000_bodies_gets_no_5xx(gateway):
    s = gateway.open()  # a key with no budget: it keeps every sample, so cap it
    s.keep = 4
    rng = random.Random(58)
    statuses: dict[int, int] = {}
    for _ in range(3000):
        path, text = mutate(rng)
        status, reply = post(gateway, text.encode("utf-8", "surrogatepass"), s.key, path)
        assert status < 500, (text[:300], reply)
        statuses[status] = statuses.get(status, 0) + 1
    assert statuses.get(200, 0) > 100 and statuses.get(400, 0) > 1000, statuses
