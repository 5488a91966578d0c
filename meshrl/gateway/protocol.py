"""The OpenAI API's request and response shapes, as far as the gateway serves them: a request body read
into a checked Request (every refusal a RequestError naming its field, answered as OpenAI's error
object), and the chat.completion / text_completion objects and their stream chunks built back.

Sampling fields the rollout cannot honour are refused, not ignored: `top_logprobs` above 0 (the rollout
reports the sampled token's log-prob only), `echo`, `logit_bias`, presence and frequency penalties,
`best_of`, `suffix`. What asks to constrain what the model writes is served by one stated rule, since
the samples a run trains on must be the policy's own (their log-probs are the loss's): `tool_choice`
required or a named function, and `response_format` json_object / json_schema, are accepted and the
model writes unconstrained (a named function is the only tool its prompt lists); the agent decides what a
reply without the call or the JSON it asked for means, as it would with any model that ignores them.

An absent or large `max_tokens` is the room left in the context (as vLLM's server reads it), cut to the
gateway's cap where it has one (a run's rollout.max_new_tokens). Input the rollout would refuse (token ids
outside the vocabulary, a seed it cannot take, stop strings too long to search, text that is not Unicode,
nesting too deep) is refused here with a 400 naming the field, so that no client mistake reaches the
rollout as a server failure.
"""

import dataclasses
import json
import time
import uuid
from typing import Any

MAX_N = 16  # choices per request
MAX_STOP = 8  # stop strings per request
MAX_STOP_CHARS = 256  # characters per stop string: the hf rollout searches each at every step (400,000: 48 s)
MAX_SEED = 2**62  # the rollout seeds row i with seed + i in an unsigned 64-bit field
MAX_DEPTH = 32  # nesting of the body's arrays and objects (a chat body needs about 6)
UNSUPPORTED = {  # fields refused unless they ask for nothing (their value that means "off")
    "echo": False,
    "logit_bias": {},
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "best_of": 1,
    "suffix": "",
}


class RequestError(Exception):
    """A request refused: HTTP `status` with OpenAI's error object (message, type, param, code)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.message, self.param, self.status, self.code = message, param, status, code

    def body(self) -> dict:
        kind = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error"}.get(self.status)
        if self.status >= 500:
            kind = "server_error"
        error = {"message": self.message, "type": kind or "invalid_request_error", "param": self.param}
        return {"error": {**error, "code": self.code}}


@dataclasses.dataclass
class Limits:
    """What one request may ask for (the gateway's caps)."""

    max_body_bytes: int = 4 << 20
    max_messages: int = 256
    max_tools: int = 64
    max_tokens: int = 0  # new tokens per choice at most (a run: rollout.max_new_tokens); 0: the room left
    max_model_len: int = 4096  # prompt and new tokens together
    vocab_size: int = 0  # token ids a completions prompt may hold are below it (0: the tokenizer's length)


@dataclasses.dataclass
class Request:
    chat: bool  # /v1/chat/completions; False: /v1/completions
    model: str
    messages: list[dict] = dataclasses.field(default_factory=list)  # chat
    tools: list[dict] | None = None  # chat
    parse_tools: bool = True  # tool_choice "none": the reply is text, its calls are not read
    prompt: str | list[int] = ""  # completions: text, or token ids
    n: int = 1
    max_tokens: int = 0  # 0: the gateway's cap
    temperature: float | None = None
    top_p: float | None = None
    stop: list[str] = dataclasses.field(default_factory=list)
    seed: int | None = None
    logprobs: bool = False
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage


def _field(body: dict, name: str, kinds: tuple[type, ...], default: Any = None) -> Any:
    value = body.get(name, default)
    if value is None or value is default:
        return value
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        wanted = " or ".join("boolean" if k is bool else k.__name__ for k in kinds)
        raise RequestError(f"'{name}' must be {wanted}, got {type(value).__name__}", name)
    return value


def _number(body: dict, name: str, low: float, high: float) -> float | None:
    value = _field(body, name, (int, float))
    if value is not None and not low <= value <= high:
        raise RequestError(f"'{name}' must be in [{low:g}, {high:g}], got {value}", name)
    return value


def _messages(body: dict, limits: Limits) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty array of messages", "messages")
    if len(messages) > limits.max_messages:
        raise RequestError(f"'messages' holds {len(messages)} messages; at most {limits.max_messages}", "messages")
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant", "tool"):
            raise RequestError(f"'{where}' needs a role: system, developer, user, assistant or tool", where)
        content = m.get("content")
        if isinstance(content, list):  # content parts: text only
            if not all(
                isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content
            ):
                raise RequestError(f"'{where}.content' may hold text parts only", f"{where}.content")
        elif content is not None and not isinstance(content, str):
            raise RequestError(f"'{where}.content' must be a string or an array of text parts", f"{where}.content")
        elif content is None and m["role"] != "assistant":
            raise RequestError(f"'{where}.content' is required for the {m['role']} role", f"{where}.content")
        calls = m.get("tool_calls")
        if calls is not None and not (m["role"] == "assistant" and isinstance(calls, list)):
            raise RequestError(f"'{where}.tool_calls' must be an array on an assistant message", where)
        for k, c in enumerate(calls or []):
            fn = c.get("function") if isinstance(c, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise RequestError(f"'{where}.tool_calls[{k}]' needs function.name", f"{where}.tool_calls")
            if not isinstance(fn.get("arguments", "{}"), (str, dict)):
                raise RequestError(f"'{where}.tool_calls[{k}].function.arguments' must be JSON text", where)
    return [normal_message(m) for m in messages]


def normal_message(m: dict) -> dict:
    """A message as the chat template sees it and as two histories are compared: text parts joined, a
    developer turn as a system one, tool calls as {name, arguments (an object)}, nothing else kept."""
    content = m.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content)
    out: dict = {"role": "system" if m["role"] == "developer" else m["role"], "content": content or ""}
    if m.get("tool_calls"):
        out["tool_calls"] = [
            {"type": "function", "function": {"name": c["function"]["name"], "arguments": arguments(c["function"])}}
            for c in m["tool_calls"]
        ]
    if m["role"] == "tool" and m.get("tool_call_id"):
        out["tool_call_id"] = m["tool_call_id"]
    if m.get("name"):
        out["name"] = m["name"]
    return out


def arguments(fn: dict) -> Any:
    """A call's arguments as an object (OpenAI sends JSON text; text that is not JSON stays text)."""
    value = fn.get("arguments", {})
    if isinstance(value, str):
        try:
            return json.loads(value or "{}")
        except ValueError:
            return value
    return value


def _tools(body: dict, limits: Limits) -> tuple[list[dict] | None, bool]:
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or len(tools) > limits.max_tools:
            raise RequestError(f"'tools' must be an array of at most {limits.max_tools} tools", "tools")
        for i, t in enumerate(tools):
            fn = t.get("function") if isinstance(t, dict) else None
            if not isinstance(fn, dict) or t.get("type", "function") != "function" or not fn.get("name"):
                raise RequestError(f"'tools[{i}]' must be a function tool with function.name", f"tools[{i}]")
    choice = body.get("tool_choice", "auto")
    if choice in ("auto", "none", "required", None):
        if choice == "required" and not tools:
            raise RequestError("'tool_choice' required needs tools", "tool_choice")
        return tools or None, choice != "none"
    # a named tool, as chat ({"type": "function", "function": {"name": ...}}) or the Responses API writes it
    named = choice.get("function", choice) if isinstance(choice, dict) else None
    name = named.get("name") if isinstance(named, dict) else None
    chosen = [t for t in tools or [] if t["function"]["name"] == name]
    if not chosen:
        raise RequestError("'tool_choice' must be auto, none, required or a function of 'tools' by name", "tool_choice")
    return chosen, True  # the prompt lists the chosen tool alone


def _stop(body: dict) -> list[str]:
    stop = body.get("stop")
    stop = [stop] if isinstance(stop, str) else stop
    if stop is not None and (
        not isinstance(stop, list) or len(stop) > MAX_STOP or not all(isinstance(s, str) and s for s in stop)
    ):
        raise RequestError(f"'stop' must be a string or an array of at most {MAX_STOP} non-empty strings", "stop")
    if any(len(s) > MAX_STOP_CHARS for s in stop or ()):
        raise RequestError(f"'stop' strings may be at most {MAX_STOP_CHARS} characters each", "stop")
    return stop or []


def _seed(body: dict) -> int | None:
    seed = _field(body, "seed", (int,))
    if seed is not None and not 0 <= seed <= MAX_SEED:
        raise RequestError(f"'seed' must be in [0, {MAX_SEED}], got {seed}", "seed")
    return seed


def _check_ids(ids: list[int], vocab_size: int) -> None:
    for i, t in enumerate(ids):
        if t < 0 or vocab_size and t >= vocab_size:
            raise RequestError(f"'prompt[{i}]': token id {t} is outside the vocabulary (0..{vocab_size - 1})", "prompt")


def check_body(body: Any) -> None:
    """RequestError naming the place where the body nests deeper than MAX_DEPTH or holds text that is not
    Unicode (a lone surrogate such as "\\ud800", which JSON allows and no tokenizer encodes)."""
    todo: list[tuple[Any, str, int]] = [(body, "", 0)]
    while todo:
        value, where, depth = todo.pop()
        if depth > MAX_DEPTH:
            raise RequestError(f"the body nests deeper than {MAX_DEPTH} levels at '{where}'", where or None)
        if isinstance(value, dict):
            todo += [(v, f"{where}.{k}" if where else str(k), depth + 1) for k, v in value.items()]
            keys = [k for k in value if not _unicode(k)]
            if keys:
                raise RequestError(f"a key in '{where or 'the body'}' is not valid Unicode", where or None)
        elif isinstance(value, list):
            todo += [(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
        elif isinstance(value, str) and not _unicode(value):
            raise RequestError(f"'{where}' is not valid Unicode (a lone surrogate)", where or None)


def _unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def read_request(body: dict, chat: bool, limits: Limits) -> Request:
    """The request body, checked (RequestError naming the field otherwise)."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    check_body(body)
    model = _field(body, "model", (str,))
    if not model:
        raise RequestError("'model' is required", "model")
    n = _field(body, "n", (int,))
    n = 1 if n is None else n  # null: OpenAI's default
    if not 1 <= n <= MAX_N:
        raise RequestError(f"'n' must be in [1, {MAX_N}]", "n")
    name = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    max_tokens = _field(body, name, (int,)) or 0
    if max_tokens < 0:
        raise RequestError(f"'{name}' must be >= 1", name)
    if limits.max_tokens:
        max_tokens = min(max_tokens, limits.max_tokens)  # capped, as a harness asking for 4096 expects to be
    if _number(body, "top_logprobs", 0, 20):
        why = "the rollout reports the sampled token's log-prob only"
        raise RequestError(f"'top_logprobs' must be 0: {why}", "top_logprobs")
    for name, off in UNSUPPORTED.items():
        if body.get(name) not in (None, off):
            raise RequestError(f"'{name}' is not supported: the rollout samples without it", name)
    fmt = body.get("response_format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema")):
        raise RequestError("'response_format' may be text, json_object or json_schema", "response_format")
    options = _field(body, "stream_options", (dict,)) or {}
    request = Request(
        chat=chat,
        model=model,
        n=n,
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 0, 2),
        top_p=_number(body, "top_p", 0, 1),
        stop=_stop(body),
        seed=_seed(body),
        stream=bool(_field(body, "stream", (bool,), False)),
        include_usage=bool(options.get("include_usage")),
    )
    if chat:
        request.messages = _messages(body, limits)
        request.tools, request.parse_tools = _tools(body, limits)
        request.logprobs = bool(_field(body, "logprobs", (bool,), False))
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            _check_ids(prompt, limits.vocab_size)
            request.prompt = prompt
        elif isinstance(prompt, str) and prompt:
            request.prompt = prompt
        else:
            raise RequestError("'prompt' must be a non-empty string or an array of token ids", "prompt")
        logprobs = _field(body, "logprobs", (int,))
        if logprobs is not None and logprobs > 1:
            raise RequestError("'logprobs' may be 0 or 1: the sampled token's log-prob only", "logprobs")
        request.logprobs = logprobs is not None
    return request


# ---- replies ------------------------------------------------------------------------------------


@dataclasses.dataclass
class Choice:
    text: str  # what the model wrote (tool calls cut out for a chat reply)
    tokens: list[str]  # each token as text (logprobs)
    logprobs: list[float]
    finish: str  # stop, length, tool_calls
    calls: list[dict] = dataclasses.field(default_factory=list)  # [{name, arguments}]
    msg: dict = dataclasses.field(default_factory=dict)  # the chat reply's message, made once (its call ids)
    count: int = 0  # tokens generated


def completion_id(chat: bool) -> str:
    return f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"


def tool_calls(calls: list[dict]) -> list[dict]:
    return [
        {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])},
        }
        for c in calls
    ]


def message(choice: Choice) -> dict:
    out: dict = {"role": "assistant", "content": choice.text if choice.text or not choice.calls else None}
    if choice.calls:
        out["tool_calls"] = tool_calls(choice.calls)
    return out


def token_logprobs(choice: Choice) -> dict:
    return {
        "content": [
            {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
            for t, lp in zip(choice.tokens, choice.logprobs)
        ]
    }


def usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def reply(request: Request, choices: list[Choice], ident: str, fingerprint: str, prompt_tokens: int) -> dict:
    """The whole chat.completion or text_completion object."""
    done = sum(c.count for c in choices)
    head = {"id": ident, "created": int(time.time()), "model": request.model, "system_fingerprint": fingerprint}
    if request.chat:
        body = [
            {
                "index": i,
                "message": c.msg or message(c),
                "logprobs": token_logprobs(c) if request.logprobs else None,
                "finish_reason": c.finish,
            }
            for i, c in enumerate(choices)
        ]
        return {**head, "object": "chat.completion", "choices": body, "usage": usage(prompt_tokens, done)}
    texts = [
        {
            "index": i,
            "text": c.text,
            "logprobs": {"tokens": c.tokens, "token_logprobs": c.logprobs, "top_logprobs": None, "text_offset": []}
            if request.logprobs
            else None,
            "finish_reason": c.finish,
        }
        for i, c in enumerate(choices)
    ]
    return {**head, "object": "text_completion", "choices": texts, "usage": usage(prompt_tokens, done)}


def chunks(request: Request, whole: dict) -> list[dict]:
    """The stream of a reply made in one piece: per choice its role, its text, its calls and its end,
    then the usage chunk if asked (the rollout returns a turn whole, so the text comes as one delta)."""
    head = {k: whole[k] for k in ("id", "created", "model", "system_fingerprint")}
    if not request.chat:
        out = [{**head, "object": "text_completion", "choices": [c]} for c in whole["choices"]]
    else:
        out = []
        kind = {**head, "object": "chat.completion.chunk"}
        for c in whole["choices"]:
            m, i = c["message"], c["index"]
            out.append({**kind, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""}}]})
            delta: dict = {"content": m["content"]} if m["content"] else {}
            if m.get("tool_calls"):
                delta["tool_calls"] = [{"index": k, **call} for k, call in enumerate(m["tool_calls"])]
            if delta:
                out.append({**kind, "choices": [{"index": i, "delta": delta, "logprobs": c["logprobs"]}]})
            out.append({**kind, "choices": [{"index": i, "delta": {}, "finish_reason": c["finish_reason"]}]})
    if request.include_usage:
        out.append({**head, "object": out[0]["object"], "choices": [], "usage": whole["usage"]})
    return out
