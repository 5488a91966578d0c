"""Tool-call parsers: the calls a policy wrote in its model's own format, by name (rollout.tool_parser).

`hermes` reads what Qwen2.5, Qwen3 and Hermes models write (and meshrl's BPE models, meshrl/tiny/bpe.py):

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "12*7"}}
    </tool_call>

one tag per call, several per turn allowed. A parser returns, in the order written, a Call for each tag:
its name and arguments, or the error that makes it unusable (not JSON, no name, arguments not an object,
a tag left open), which the run answers as that call's tool result so the policy can learn from it.
"""

import dataclasses
import json
import re
from collections.abc import Callable


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


PARSERS: dict[str, Callable[[str], list[Call]]] = {"hermes": hermes}
CONTENT: dict[str, Callable[[str], str]] = {"hermes": hermes_content}  # each parser's text without the calls
