"""The OpenAI-compatible gateway (meshrl/gateway) through the real `openai` client over real HTTP, with a
scripted engine in place of the rollout (the rollout behind it: tests/contract/test_multi_turn_tools.py):
tool calls in the model's template, streaming, n > 1, log-probs, token-exact recording and branching,
keys that reach their own session only, and every malformed request answered 4xx with its field named."""

import http.client
import json

import openai
import pytest

from meshrl.gateway.server import Gateway
from meshrl.gateway.sessions import Session
from meshrl.tiny.arithmetic import CALCULATOR

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2*3"}}\n</tool_call><|im_end|>'
ANSWER = "6<|im_end|>"


class Scripted:
    """Calls the calculator until a tool result is in the prompt, then answers; log-prob -k/10 for token k."""

    def __init__(self, tok):
        self.tok, self.calls = tok, []

    def generate(self, session, ids, n, max_new, request):
        self.calls.append(ids)
        text = ANSWER if "<tool_response>" in self.tok.decode(ids) else CALL
        tokens = self.tok(text, add_special_tokens=False)["input_ids"][:max_new]
        return [(tokens, [-k / 10 for k in range(len(tokens))], None, 7)] * n


@pytest.fixture(scope="module")
def tok(bpe_tok):
    return bpe_tok


@pytest.fixture
def gateway(tok):
    ends = frozenset([tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")])
    g = Gateway(Scripted(tok), tok, "policy", ends, tool_parser="hermes").start()
    yield g
    g.stop()


def client(g: Gateway, session: Session) -> openai.OpenAI:
    return openai.OpenAI(base_url=g.base_url, api_key=session.key, max_retries=0)


def ask(c, messages, **kw):
    return c.chat.completions.create(model="policy", messages=messages, tools=[CALCULATOR], **kw)


def test_a_tool_round_trip_is_recorded_token_for_token(gateway, tok):
    s = gateway.open()
    c = client(gateway, s)
    messages = [{"role": "user", "content": "2*3="}]
    first = ask(c, messages, logprobs=True)
    m = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls" and m.content is None
    assert m.tool_calls[0].function.name == "calculator"
    assert json.loads(m.tool_calls[0].function.arguments) == {"expression": "2*3"}
    assert first.system_fingerprint == "meshrl-v7" and first.usage.completion_tokens == len(tok(CALL)["input_ids"])
    assert [t.logprob for t in first.choices[0].logprobs.content][:3] == [0.0, -0.1, -0.2]
    messages += [m.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": m.tool_calls[0].id, "content": "6"}]
    second = ask(c, messages)
    assert second.choices[0].message.content == "6" and second.choices[0].finish_reason == "stop"
    assert len(s.samples) == 1  # the second call extended the first call's sample
    traj = s.final()
    # the template's rendering of the whole conversation, the model's turns kept as they were sampled
    whole = tok.apply_chat_template(
        [*messages, {"role": "assistant", "content": "6"}], tools=[CALCULATOR], tokenize=False
    ).removesuffix("\n")
    assert tok.decode(traj.prompt + traj.tokens) == whole
    call, answer = (len(tok(t, add_special_tokens=False)["input_ids"]) for t in (CALL, ANSWER))
    assert traj.mask[:call] == [1] * call and traj.mask[-answer:] == [1] * answer
    assert sum(traj.mask) == call + answer and traj.versions == [7, 7]
    assert traj.logprobs[:3] == [0.0, -0.1, -0.2] and all(lp == 0 for lp, k in zip(traj.logprobs, traj.mask) if not k)


def test_an_edited_history_branches_and_a_retry_forks_from_its_mark(gateway, tok):
    s = gateway.open()
    c = client(gateway, s)
    messages = [{"role": "user", "content": "2*3="}]
    m = ask(c, messages).choices[0].message
    tool = {"role": "tool", "tool_call_id": m.tool_calls[0].id, "content": "6"}
    ask(c, [*messages, m.model_dump(exclude_none=True), tool])
    ask(c, [*messages, m.model_dump(exclude_none=True), {**tool, "content": "7"}])  # a retry from the mark
    first, retry = (x.traj for x in s.samples)
    mark = s.samples[0].marks[0][1]  # where the first turn ended
    assert len(s.samples) == 2 and retry is s.final() and retry.tokens[:mark] == first.tokens[:mark]
    assert "<tool_response>\n7" in tok.decode(retry.tokens[mark:]) and "7" not in tok.decode(first.tokens[mark:])
    assert sum(s.samples[1].traj.mask) == sum(s.samples[0].traj.mask)  # the first turn is still trained
    edited = {"role": "assistant", "content": "I will use the calculator."}  # not what the model wrote
    ask(c, [*messages, edited, tool])
    assert len(s.samples) == 3
    fresh = s.final()
    assert sum(fresh.mask) == len(tok(ANSWER, add_special_tokens=False)["input_ids"])  # only the new turn
    assert "I will use the calculator." in tok.decode(fresh.prompt)


def test_n_choices_stream_and_completions(gateway, tok):
    s = gateway.open()
    c = client(gateway, s)
    many = ask(c, [{"role": "user", "content": "2*3="}], n=3, max_tokens=10**6)  # capped, not refused
    assert [ch.index for ch in many.choices] == [0, 1, 2] and len(s.samples) == 3
    call = tok(CALL, add_special_tokens=False)["input_ids"]
    # each choice follows the same prompt, none after another; the first is the episode's from now on
    assert [x.traj.tokens for x in s.samples] == [call] * 3 and s.final() is s.samples[0].traj
    chunks = list(ask(c, [{"role": "user", "content": "1+1="}], stream=True, stream_options={"include_usage": True}))
    calls = [d.function.arguments for ch in chunks if ch.choices for d in ch.choices[0].delta.tool_calls or []]
    assert calls == ['{"expression": "2*3"}'] and chunks[-1].usage.completion_tokens > 0
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "tool_calls"
    done = c.completions.create(model="policy", prompt=[1, 2, 3], max_tokens=4, logprobs=1)
    assert done.choices[0].finish_reason == "length" and len(done.choices[0].logprobs.token_logprobs) == 4
    again = c.completions.create(model="policy", prompt=[1, 2, 3, *s.final().tokens, 9], max_tokens=4)
    assert again.choices[0].text and s.final().mask[:4] == [1] * 4 and s.final().mask[4] == 0  # extended in place
    assert [m.id for m in c.models.list().data] == ["policy"]


def test_a_spent_budget_answers_an_empty_turn(gateway):
    s = gateway.open(Session(budget=30, max_calls=2))
    c = client(gateway, s)
    first = ask(c, [{"role": "user", "content": "2*3="}], max_tokens=8)
    assert first.choices[0].finish_reason == "length" and first.usage.completion_tokens == 8
    m = first.choices[0].message
    ask(c, [{"role": "user", "content": "2*3="}, m.model_dump(exclude_none=True), {"role": "user", "content": "go"}])
    third = ask(c, [{"role": "user", "content": "4*4="}])
    assert third.choices[0].message.content == "" and third.choices[0].finish_reason == "length"


def test_a_key_reaches_its_own_session_and_ends_with_its_episode(gateway):
    a, b = gateway.open(), gateway.open()
    ask(client(gateway, a), [{"role": "user", "content": "2*3="}])
    assert len(a.samples) == 1 and not b.samples
    gateway.close(a.key)
    with pytest.raises(openai.AuthenticationError):
        ask(client(gateway, a), [{"role": "user", "content": "2*3="}])
    with pytest.raises(openai.AuthenticationError):
        ask(
            openai.OpenAI(base_url=gateway.base_url, api_key="sk-guess", max_retries=0),
            [{"role": "user", "content": "x"}],
        )
    assert len(a.samples) == 1 and not b.samples


BAD = [  # (body, the field the error names)
    ({"messages": [{"role": "user", "content": "x"}]}, "model"),
    ({"model": "p"}, "messages"),
    ({"model": "p", "messages": []}, "messages"),
    ({"model": "p", "messages": [{"role": "wizard", "content": "x"}]}, "messages[0]"),
    ({"model": "p", "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"model": "p", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content"),
    ({"model": "p", "messages": [{"role": "user", "content": "x"}], "n": 0}, "n"),
    ({"model": "p", "messages": [{"role": "user", "content": "x"}], "n": 99}, "n"),
    ({"model": "p", "messages": [{"role": "user", "content": "x"}], "temperature": 9}, "temperature"),
    ({"model": "p", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, "temperature"),
    ({"model": "p", "messages": [{"role": "user", "content": "x"}], "max_tokens": -1}, "max_tokens"),
    ({"model": "p", "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, "messages[0].content"),
    ({"model": "p", "messages": [{"role": "user", "content": "x"}], "tools": ["x"]}, "tools[0]"),
    ({"model": "p", "messages": [{"role": "user", "content": "x"}], "echo": True}, "echo"),
    ({"model": "p", "messages": [{"role": "user", "content": "x"}], "logit_bias": {"5": 100}}, "logit_bias"),
    ({"model": "p", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 5}, "top_logprobs"),
    (
        {"model": "p", "messages": [{"role": "user", "content": "x"}], "tool_choice": "required"},
        "tool_choice",
    ),  # no tools
    (
        {
            "model": "p",
            "messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "function", "function": {"name": "a"}}],
            "tool_choice": {"type": "function", "function": {"name": "b"}},
        },
        "tool_choice",
    ),
    ({"model": "p", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "web"}]}, "tools[0]"),
    ({"model": "p", "messages": [{"role": "user", "content": "x"}], "stop": [""]}, "stop"),
    ({"model": "p", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "stream"),
    ({"model": "p", "messages": [{"role": "assistant", "tool_calls": [{"x": 1}]}]}, "messages[0].tool_calls"),
    (
        {"model": "p", "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}},
        "response_format",
    ),
    ({"model": "p", "messages": [{"role": "user", "content": "x" * 20000}]}, "messages"),  # past max_model_len
]


def raw(g: Gateway, method: str, path: str, body: bytes | None, key: str | None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection(*g.http.server_address[:2], timeout=10)
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    conn.request(method, path, body=body, headers=headers)
    r = conn.getresponse()
    return r.status, json.loads(r.read() or b"{}")


@pytest.mark.parametrize("body,field", BAD)
def test_malformed_requests_get_4xx_naming_the_field(gateway, body, field):
    s = gateway.open()
    status, reply = raw(gateway, "POST", "/v1/chat/completions", json.dumps(body).encode(), s.key)
    assert status == 400 and reply["error"]["param"] == field, reply
    assert not s.samples


def test_everything_else_is_answered_too(gateway):
    s = gateway.open()
    assert raw(gateway, "POST", "/v1/chat/completions", b"{not json", s.key)[0] == 400
    assert raw(gateway, "POST", "/v1/chat/completions", b"[1, 2]", s.key)[0] == 400
    assert raw(gateway, "POST", "/v1/chat/completions", b"{}", None)[0] == 401
    assert raw(gateway, "POST", "/v1/embeddings", b"{}", s.key)[0] == 404
    assert raw(gateway, "DELETE", "/v1/models", None, s.key)[0] == 405
    assert raw(gateway, "GET", "/health", None, None) == (200, {"status": "ok"})
    gateway.limits.max_body_bytes = 100
    assert raw(gateway, "POST", "/v1/completions", b"{" + b" " * 200 + b"}", s.key)[0] == 413
    # and it still serves
    gateway.limits.max_body_bytes = 1 << 20
    assert ask(client(gateway, s), [{"role": "user", "content": "2*3="}]).choices


class Failing:
    def generate(self, session, ids, n, max_new, request):
        raise ConnectionError("the rollout is gone")


def test_a_failing_engine_is_a_503_and_the_connection_lives_on(tok):
    g = Gateway(Failing(), tok, "policy", frozenset([tok.eos_token_id]), tool_parser="hermes").start()
    try:
        s = g.open()
        body = json.dumps({"model": "p", "messages": [{"role": "user", "content": "x"}]}).encode()
        status, reply = raw(g, "POST", "/v1/chat/completions", body, s.key)
        assert status == 503 and "the rollout is gone" in reply["error"]["message"] and not s.samples
        conn = http.client.HTTPConnection(*g.http.server_address[:2], timeout=10)
        headers = {"Authorization": f"Bearer {s.key}", "Transfer-Encoding": "chunked"}
        conn.request("POST", "/v1/chat/completions", body=iter([body]), headers=headers)
        r = conn.getresponse()
        assert r.status == 411 and r.getheader("Connection") == "close"
    finally:
        g.stop()
