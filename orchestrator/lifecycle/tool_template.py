"""Whether the model's chat template speaks tools, checked before any service starts on the tool path.

    check(cfg, roles)                    # ValueError, one line: what is missing and where the template is
    probe(tokenizer, parser, path)       # the same on a tokenizer; the reason without the model's name

The tool path is a multi-turn run with rollout.tool_parser, or SFT on conversations with tool calls. A
template without tool support (Llama 3.0's, most base models') renders such a run without an error and
teaches something else: the prompt lists no tools, a call turn is an empty turn, the calls the policy
writes parse to nothing, tool results come in a role the model never saw. So a probe conversation is
rendered (apply_chat_template(tokenize=False)) and searched for
  1. the tool schema given as tools= (the tool's name and its parameter's, in the prompt),
  2. an assistant tool call (its name and argument value in the turn), which the run's tool parser reads
     back, from the turn as a policy's decoded text, as the same call,
  3. a tool result (its content).
The probe's names are ones no template writes of itself.
"""

import json
import os
import pathlib

from meshrl.chat import after_turn, turns
from meshrl.rows import plain, read_rows
from meshrl.tool_calls import parser_for
from orchestrator.config import Config

NAME, PARAM, VALUE, RESULT = "probe_lookup_zq", "probe_city_zq", "Zanzibar-4711", "probe result 9137"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": NAME,
            "description": "a probe of the chat template",
            "parameters": {"type": "object", "properties": {PARAM: {"type": "string"}}, "required": [PARAM]},
        },
    }
]
USER = {"role": "user", "content": "Look it up."}
CALL_ID = "probe0001"  # nine letters and digits: Mistral's templates refuse other ids
CALL = {
    "role": "assistant",
    "content": "",
    "tool_calls": [{"id": CALL_ID, "type": "function", "function": {"name": NAME, "arguments": {PARAM: VALUE}}}],
}
ANSWER = {"role": "tool", "tool_call_id": CALL_ID, "name": NAME, "content": RESULT}
PATHS = ("rollout", "sft")


def check(cfg: Config, roles: set[str]) -> None:
    """On the tool path, the template of actor.model renders the probe (the module's three points)."""
    r = cfg.rollout
    if "rollout" in roles:
        if not (r.episodes and r.tool_parser):
            return
        path, parser, what = "rollout", r.tool_parser, f"rollout.tool_parser={r.tool_parser}"
    elif calls_in(cfg):  # no rollout: SFT, which trains the rows' conversations as written
        path, parser, what = "sft", "", "SFT on tool calls (data.train_files)"
    else:
        return
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(cfg.actor.model)
    missing = probe(tokenizer, parser, path)
    if missing:
        raise ValueError(
            f"the chat template of {cfg.actor.model} ({template_source(cfg.actor.model)}) {missing}; {what} "
            "needs a template with tool support (a chat_template.jinja in the model folder replaces it)"
        )


def probe(tokenizer, parser: str = "", path: str = "rollout") -> str:
    """What the template fails to render of the probe ("" if nothing), as the end of a sentence about it.
    parser: the tool parser's name, which must read the call back. path "rollout" also asks for the text
    a multi-turn run appends after a call turn (chat.after_turn), "sft" for SFT's cut (chat.turns)."""
    assert path in PATHS, path

    def render(messages: list[dict], prompt: bool) -> str:
        return tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=prompt)

    try:
        prompt = render([USER], True)
    except Exception as e:  # noqa: BLE001 - the template is the model's own code
        return f"cannot render a prompt with tools: {type(e).__name__}: {e}"
    if NAME not in prompt or PARAM not in prompt:
        return f"does not render the tool schema given as tools= (no {NAME!r} or {PARAM!r} in {quoted(prompt)})"
    try:
        called = render([USER, CALL], False)
    except Exception as e:  # noqa: BLE001
        return f"cannot render an assistant tool call (tool_calls): {type(e).__name__}: {e}"
    turn = called[len(os.path.commonprefix([prompt, called])) :]
    if NAME not in turn or VALUE not in turn:
        return f"does not render an assistant tool call (tool_calls): the call turn is {tail(turn)}"
    if parser:
        read = parser_for(parser, tokenizer, TOOLS)  # ValueError: no such parser, or not for this vocabulary
        assert read is not None
        # what the policy's turn reads as after sampling: decoded as the parser reads a turn
        text = read.readable(tokenizer(turn, add_special_tokens=False)["input_ids"])
        calls = [(c.name, c.arguments, c.error) for c in read(text)]
        if calls != [(NAME, {PARAM: VALUE}, "")]:
            return (
                f"writes a tool call that rollout.tool_parser={parser} does not read back: {tail(text)} parses "
                f"to {calls or 'no call'} (the parser must be the template's family's)"
            )
    try:
        answered = render([USER, CALL, ANSWER], True)
    except Exception as e:  # noqa: BLE001
        return f"cannot render tool results (role 'tool'): {type(e).__name__}: {e}"
    if RESULT not in answered:
        return f"does not render tool results (role 'tool'): {RESULT!r} is not in {tail(answered)}"
    try:
        if path == "rollout":
            after_turn(tokenizer, [ANSWER], TOOLS)
        else:
            turns(tokenizer, [USER, CALL, ANSWER, {"role": "assistant", "content": "done"}], "the probe", TOOLS)
    except ValueError as e:
        return f"cannot be cut into turns as the run needs: {e}"
    return ""


def quoted(text: str, limit: int = 160) -> str:
    """A rendering, quoted, cut to its start: a prompt lists the tools there."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


def tail(text: str, limit: int = 160) -> str:
    """A rendering, quoted, cut to its end: where the missing turn would be."""
    return repr(text if len(text) <= limit else "..." + text[-limit:])


def calls_in(cfg: Config) -> bool:
    """Some conversation of data.train_files has an assistant turn with tool calls. A file that cannot be
    read, or lacks the prompt column, is left to the data's own checks and their messages."""
    key = cfg.data.prompt_key
    try:
        frame = read_rows(pathlib.Path(cfg.data.train_files), "data.train_files")
    except (OSError, ValueError):
        return False
    if key not in frame.columns:
        return False
    for cell in frame[key]:
        messages = plain(cell)
        if isinstance(messages, list) and any(
            isinstance(m, dict) and m.get("role") == "assistant" and m.get("tool_calls") for m in messages
        ):
            return True
    return False


def template_source(model: str) -> str:
    """Where transformers reads the model's chat template from (chat_template.jinja wins)."""
    folder = pathlib.Path(model)
    if (folder / "chat_template.jinja").is_file():
        return str(folder / "chat_template.jinja")
    config = folder / "tokenizer_config.json"
    if config.is_file() and json.loads(config.read_text()).get("chat_template"):
        return f"{config}'s chat_template"
    return f"no chat template in {folder}"
