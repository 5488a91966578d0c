"""Tool-call parsers: the calls a policy wrote in its model's own format, by name (rollout.tool_parser).

`hermes` reads what Qwen2.5, Qwen3 and Hermes models write (and meshrl's BPE models, meshrl/tiny/bpe.py):

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "12*7"}}
    </tool_call>

one tag per call, several per turn allowed. A parser returns, in the order written, a Call for each tag:
its name and arguments, or the error that makes it unusable (not JSON, no name, arguments not an object,
a tag left open), which the run answers as that call's tool result so the policy can learn from it.

Every other name is one of vLLM's parsers (llama3_json, mistral, qwen3_coder, deepseek_v3, glm45,
pythonic, ...), read through meshrl/vllm_tools.py to the same rule. `parser_for(name, tokenizer)` gives
either as a Parser: calls(text), content(text) and readable(tokens), the turn's text as it reads it.
"""

import dataclasses
import json
import re
from collections.abc import Callable
from typing import Protocol


@dataclasses.dataclass
class Call:
    name: str = ""
    arguments: dict = dataclasses.field(default_factory=dict)
    error: str = ""  # why the call cannot be made; name and arguments are then empty


HERMES = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)


def hermes(text: str) -> list[Call]:
    calls = []
    for body, closed in HERMES.findall(text):
        if not closed:
            calls.append(Call(error="the <tool_call> tag is not closed"))
            continue
        try:
            call = json.loads(body)
        except ValueError as e:
            calls.append(Call(error=f"the tool call is not JSON: {e}"))
            continue
        name = call.get("name") if isinstance(call, dict) else None
        arguments = call.get("arguments", {}) if isinstance(call, dict) else None
        if isinstance(arguments, str):  # OpenAI's convention: the arguments as JSON text
            try:
                arguments = json.loads(arguments)
            except ValueError:
                arguments = None
        if not isinstance(name, str) or not name or not isinstance(arguments, dict):
            calls.append(Call(error='a tool call is {"name": "...", "arguments": {...}}'))
            continue
        calls.append(Call(name, arguments))
    return calls


def hermes_content(text: str) -> str:
    """The text a turn says besides its calls (an OpenAI reply's `content`)."""
    return HERMES.sub("", text).strip()


PARSERS: dict[str, Callable[[str], list[Call]]] = {"hermes": hermes}  # built in: no vLLM import
CONTENT: dict[str, Callable[[str], str]] = {"hermes": hermes_content}  # each parser's text without the calls


class Parser(Protocol):
    special: bool  # its format opens calls with special tokens: read the turn with them (readable)

    def __call__(self, text: str) -> list[Call]: ...

    def content(self, text: str) -> str: ...

    def readable(self, tokens: list[int]) -> str: ...


class Builtin:
    special = False

    def __init__(self, name: str, tokenizer):
        self.name, self.tokenizer = name, tokenizer

    def __call__(self, text: str) -> list[Call]:
        return PARSERS[self.name](text)

    def content(self, text: str) -> str:
        return CONTENT[self.name](text)

    def readable(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)


def parser_for(name: str, tokenizer, tools: list[dict] | None = None) -> Parser | None:
    """rollout.tool_parser's Parser for this tokenizer (None for ""); ValueError in one line for a name
    no parser has, or a parser whose family's tokens the tokenizer lacks."""
    if not name:
        return None
    if name in PARSERS:
        return Builtin(name, tokenizer)
    from meshrl.vllm_tools import VllmParser  # vLLM's import takes seconds: only for its parsers

    return VllmParser(name, tokenizer, tools)
