"""OpenAI's Responses API (`POST /v1/responses`) on the chat path: a request's `instructions`, `input`
items and flat function tools become a chat completions body, which the gateway serves and records as it
serves chat (token for token, the same sessions); its chat.completion becomes a Response with a message
item and function_call items, or the stream of events the SDKs read.

Served: `input` as text or items (messages with text parts, function_call, function_call_output; reasoning
items are passed over: the policy's own turns are what the recording holds), `instructions`, function
`tools`, `tool_choice`, `max_output_tokens`, `temperature`, `top_p`, `text.format` (as response_format),
`stream`. Nothing is stored, so `previous_response_id` and item references are refused with a 400 saying
to send the whole input; hosted tools (web search, files) too. Settings that change nothing about what
is sampled (`store`, `metadata`, `include`, `parallel_tool_calls`, `truncation`, `user`, `reasoning`)
are accepted and left.
"""

import json
import time
import uuid
from typing import Any

from meshrl.gateway.protocol import RequestError

PASSED = ("model", "temperature", "top_p", "tool_choice", "seed")  # the same in both APIs
SAMPLING = ("top_logprobs", "logit_bias", "presence_penalty", "frequency_penalty")  # checked by the chat path


def chat_body(body: Any) -> dict:
    """The chat completions body that asks what a Responses request asks (RequestError naming the field)."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    for name in ("previous_response_id", "conversation"):
        if body.get(name) is not None:
            raise RequestError(f"'{name}': nothing is stored here; send the whole conversation as 'input'", name)
    out: dict = {k: body[k] for k in (*PASSED, *SAMPLING) if k in body}
    messages = [{"role": "system", "content": body["instructions"]}] if body.get("instructions") else []
    out["messages"] = messages + _items(body.get("input"))
    if body.get("max_output_tokens") is not None:
        out["max_tokens"] = body["max_output_tokens"]
    if body.get("tools") is not None:
        out["tools"] = _tools(body["tools"])
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if fmt is not None:
        out["response_format"] = fmt
    return out


def _items(items: Any) -> list[dict]:
    if isinstance(items, str) and items:
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise RequestError("'input' must be a non-empty string or an array of items", "input")
    messages: list[dict] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message":
            if item.get("role") not in ("system", "developer", "user", "assistant"):
                raise RequestError(f"'{where}.role' must be system, developer, user or assistant", where)
            messages.append({"role": item["role"], "content": _text(item.get("content"), where)})
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function"}
            call["function"] = {"name": item.get("name"), "arguments": item.get("arguments", "{}")}
            if messages and messages[-1]["role"] == "assistant":  # calls of one turn: one assistant message
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _text(output, f"{where}.output")
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": text})
        elif kind == "reasoning":
            continue
        else:
            raise RequestError(
                f"'{where}' is not an item served here (message, function_call, function_call_output)", where
            )
    return messages


def _text(content: Any, where: str) -> Any:
    """A message's content: text, or its text parts joined (input_text, output_text); else refused."""
    if isinstance(content, str) or content is None:
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict)
        and p.get("type") in ("input_text", "output_text", "text")
        and isinstance(p.get("text"), str)
        for p in content
    ):
        return "".join(p["text"] for p in content)
    raise RequestError(f"'{where}.content' may hold text parts only (input_text, output_text)", f"{where}.content")


def _tools(tools: Any) -> list:
    if not isinstance(tools, list):
        raise RequestError("'tools' must be an array of function tools", "tools")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") != "function" or not t.get("name"):
            raise RequestError(
                f"'tools[{i}]' must be a function tool with a name (hosted tools are not served)", f"tools[{i}]"
            )
        fn = {k: t[k] for k in ("name", "description", "parameters") if t.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out


def response(body: dict, chat: dict) -> dict:
    """The Response object of a served chat.completion (one choice: the Responses API has no n)."""
    choice = chat["choices"][0]
    message, output = choice["message"], []
    if message.get("content"):
        part = {"type": "output_text", "text": message["content"], "annotations": [], "logprobs": []}
        item: dict[str, Any] = {"type": "message", "id": f"msg_{uuid.uuid4().hex[:24]}", "role": "assistant"}
        output.append({**item, "status": "completed", "content": [part]})
    for call in message.get("tool_calls") or []:
        fn = call["function"]
        head = {"type": "function_call", "id": f"fc_{uuid.uuid4().hex[:24]}", "call_id": call["id"]}
        output.append({**head, "name": fn["name"], "arguments": fn["arguments"], "status": "completed"})
    cut = choice["finish_reason"] == "length"
    usage = chat["usage"]
    return {
        "id": f"resp_{uuid.uuid4().hex[:24]}",
        "object": "response",
        "created_at": int(time.time()),
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "error": None,
        "model": chat["model"],
        "instructions": body.get("instructions"),
        "output": output,
        "parallel_tool_calls": bool(body.get("parallel_tool_calls", True)),
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "max_output_tokens": body.get("max_output_tokens"),
        "previous_response_id": None,
        "metadata": body.get("metadata") or {},
        "text": body.get("text") or {"format": {"type": "text"}},
        "usage": {
            "input_tokens": usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["total_tokens"],
        },
    }


def events(whole: dict) -> list[tuple[str, dict]]:
    """The stream of a Response made in one piece: created, each output item added with its text or
    arguments as one delta and done, then completed (the rollout returns a turn whole)."""
    started = {**whole, "status": "in_progress", "output": [], "usage": None}
    out: list[tuple[str, dict]] = [("response.created", {"response": started})]
    out.append(("response.in_progress", {"response": started}))
    for i, item in enumerate(whole["output"]):
        head = {"output_index": i, "item_id": item["id"]}
        if item["type"] == "message":
            empty = {**item, "status": "in_progress", "content": []}
            out.append(("response.output_item.added", {"output_index": i, "item": empty}))
            part = item["content"][0]
            out.append(("response.content_part.added", {**head, "content_index": 0, "part": {**part, "text": ""}}))
            delta = {**head, "content_index": 0, "delta": part["text"], "logprobs": []}
            out.append(("response.output_text.delta", delta))
            done = {**head, "content_index": 0, "text": part["text"], "logprobs": []}
            out.append(("response.output_text.done", done))
            out.append(("response.content_part.done", {**head, "content_index": 0, "part": part}))
        else:
            out.append(("response.output_item.added", {"output_index": i, "item": {**item, "arguments": ""}}))
            out.append(("response.function_call_arguments.delta", {**head, "delta": item["arguments"]}))
            done = {**head, "name": item["name"], "arguments": item["arguments"]}
            out.append(("response.function_call_arguments.done", done))
        out.append(("response.output_item.done", {"output_index": i, "item": item}))
    out.append(("response.completed" if whole["status"] == "completed" else "response.incomplete", {"response": whole}))
    return [(kind, {"type": kind, "sequence_number": n, **data}) for n, (kind, data) in enumerate(out)]


def sse(kind: str, data: dict) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()
