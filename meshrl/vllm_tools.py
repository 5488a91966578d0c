"""Tool calls in every family's format, read by vLLM's own parsers (rollout.tool_parser=NAME for any
parser the installed vLLM registers: llama3_json, mistral, qwen3_coder, qwen3_xml, deepseek_v3, glm45,
pythonic, kimi_k2, ...), kept to meshrl's rule that a call that cannot be made is answered with its error.

vLLM's parsers read a whole turn and, where a call in it is malformed, most drop every call and return
the text as content. meshrl must answer each call, and a broken one with why, so the policy learns from
it: where a parser reads fewer calls than the turn opens (its start marker, e.g. <tool_call>), the turn is
read again call by call, and an opened call that yields nothing is a Call with an error. Arguments that
are not a JSON object are an error too, as in the hermes parser (meshrl/tool_calls.py).

Some formats open calls with special tokens (Mistral's [TOOL_CALLS], DeepSeek's <｜tool▁calls▁begin｜>),
which a decoding that skips special tokens loses; such a parser says `special`, and its caller decodes
the turn with them (`readable`). Importing vLLM costs seconds, so this module is imported only for a
parser that is not built in.
"""

import json
import logging
import threading

from meshrl.tool_calls import Call

MARKERS = ("tool_call_start_token", "tool_calls_start_token", "bot_token", "tool_call_prefix")
# where a parser holds no start marker of its own (it wraps another engine): what opens its format's calls.
# Formats with no marker at all (llama3_json's bare JSON, pythonic's [f(x=1)]) cannot tell a broken call
# from an answer: a turn they read no call from is the final answer.
OPENS = {"qwen3_coder": "<tool_call>", "qwen3_xml": "<tool_call>", "glm45": "<tool_call>", "glm47": "<tool_call>"}


class VllmParser:
    """vLLM's parser `name` for `tokenizer`, as meshrl's Parser: calls(text), content(text), readable()."""

    def __init__(self, name: str, tokenizer, tools: list[dict] | None = None):
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.tool_parsers import ToolParserManager

        known = ToolParserManager.list_registered()
        if name not in known:
            raise ValueError(
                f"rollout.tool_parser={name!r} is not a parser: hermes, or one of vLLM's: {', '.join(known)}"
            )
        cls = ToolParserManager.get_tool_parser(name)
        # the request a parser reads the tools' schemas from (some convert arguments by the schema's types)
        body = {"model": "policy", "messages": [{"role": "user", "content": ""}], "tools": tools or None}
        self.request = ChatCompletionRequest.model_validate(body)
        try:
            self.parser = cls(tokenizer, tools=list(self.request.tools or [])) if tools else cls(tokenizer)
        except (RuntimeError, ValueError, KeyError) as e:  # the family's tool tokens are not in this vocabulary
            raise ValueError(f"rollout.tool_parser={name} does not fit this tokenizer: {e}") from None
        # a policy writes broken calls all the time; each is answered to it, not logged as vLLM's error
        logging.getLogger(cls.__module__).setLevel(logging.CRITICAL)
        self.name, self.tokenizer = name, tokenizer
        markers = [getattr(self.parser, m, None) for m in MARKERS]
        self.marker = next((m for m in markers if isinstance(m, str) and m), OPENS.get(name, ""))
        # a format whose markers are special tokens is read from a decoding that keeps them; the turn's end
        # (its end token, what a template puts after it) is cut off that decoding (readable)
        special = set(getattr(tokenizer, "all_special_tokens", []))
        own = {v for v in strings(self.parser) if v in special}
        self.special = bool(own)
        # the turn's end: the end-of-text and padding tokens, and the other special tokens named as an end
        # (<|im_end|>, <|eot_id|>, <|end|>, ...); a family's own tool tokens are never one
        ends = {tokenizer.eos_token, tokenizer.pad_token} | {t for t in special if "end" in t.lower() or "eot" in t}
        self.ends = frozenset(tokenizer.convert_tokens_to_ids(sorted(t for t in ends - own if t)))
        self.lock = threading.Lock()  # a parser keeps streaming state on itself
        try:
            self._extract("")
        except NotImplementedError as e:  # a stub (gpt-oss's harmony format is read elsewhere in vLLM)
            raise ValueError(f"rollout.tool_parser={name} cannot read a whole turn here: {e}") from None

    def _extract(self, text: str):
        with self.lock:
            return self.parser.extract_tool_calls(text, self.request)

    def readable(self, tokens: list[int]) -> str:
        """The turn's text as the parser reads it: special tokens kept where the format has them, the
        special tokens that end the turn (and what follows them) cut off."""
        if not self.special:
            return self.tokenizer.decode(tokens, skip_special_tokens=True)
        end = next((i for i, t in enumerate(tokens) if t in self.ends), len(tokens))
        return self.tokenizer.decode(tokens[:end], skip_special_tokens=False)

    def __call__(self, text: str) -> list[Call]:
        opened = text.count(self.marker) if self.marker else 0
        calls = self._read(text)
        if len(calls) >= opened or opened == 0:
            return calls
        # fewer calls than the turn opens: read each opened call alone, so each gets a call or an error
        pieces = text.split(self.marker)[1:]
        out: list[Call] = []
        for piece in pieces:
            alone = self._read(self.marker + piece)
            out += alone or [Call(error=f"the tool call could not be read ({self.name} format): {cut(piece)}")]
        return out

    def _read(self, text: str) -> list[Call]:
        try:
            info = self._extract(text)
        except Exception:  # noqa: BLE001 - a parser's failure on the model's text is that turn's error, not ours
            return []
        return [as_call(c.function.name, c.function.arguments) for c in info.tool_calls] if info.tools_called else []

    def content(self, text: str) -> str:
        info = self._extract(text)
        return (info.content or "").strip() if info.tools_called else text


def strings(parser) -> list[str]:
    """The strings a parser holds as attributes or properties (its format's tokens among them)."""
    out = []
    for name in dir(parser):
        if name.startswith("__"):
            continue
        try:
            value = getattr(parser, name)
        except Exception:  # noqa: BLE001 - a property that needs state a whole-turn parse never sets
            continue
        if isinstance(value, str):
            out.append(value)
    return out


def as_call(name, arguments) -> Call:
    """A parsed call as meshrl's Call: arguments a JSON object, else the call's error."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments or "{}")
        except ValueError as e:
            return Call(error=f"the tool call's arguments are not JSON: {e}")
    if not isinstance(name, str) or not name or not isinstance(arguments, dict):
        return Call(error="a tool call needs a name and arguments that are an object")
    return Call(name, arguments)


def cut(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")
