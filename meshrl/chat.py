"""What a prompt may be, checked once for every side that renders one with a chat template.

A prompt is a list of chat messages ({role, content}) as verl's parquet holds
them, or a plain string as OpenRLHF and TRL data hold it, which is one user
message. Anything else is refused with the row named: a chat template iterates
over whatever it is given, so a string passed as messages renders as garbage
without an error. A row may also carry `tools` (function schemas, as TRL's
datasets do), which the template lists; SFT cuts a conversation into trained
and untrained pieces (turns), and a multi-turn episode appends tool results as
the template renders them (after_turn).
"""

import json

ROLES = ("system", "user", "assistant", "tool")


def as_messages(prompt, where: str) -> list[dict]:
    """The prompt as chat messages; ValueError naming `where` (e.g. "data.train_files row 3") otherwise."""
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError(f"{where}: the prompt is an empty string")
        return [{"role": "user", "content": prompt}]
    if not isinstance(prompt, (list, tuple)) or not prompt:
        raise ValueError(
            f"{where}: a prompt is a string or a non-empty list of chat messages "
            f"({{role, content}}), got {type(prompt).__name__}"
        )
    for i, m in enumerate(prompt):
        if (
            not isinstance(m, dict)
            or not isinstance(m.get("role"), str)
            or "content" not in m
            and "tool_calls" not in m
        ):
            raise ValueError(f"{where}: message {i} must be a mapping with 'role' and 'content', got {m!r:.80}")
        if m["role"] not in ROLES:
            raise ValueError(f"{where}: message {i} has role {m['role']!r}; known: {list(ROLES)}")
        if m.get("content") is not None and not isinstance(m["content"], (str, list)):
            raise ValueError(f"{where}: message {i}'s content must be text, got {type(m['content']).__name__}")
    return list(prompt)


def as_tools(tools, where: str) -> list[dict] | None:
    """A row's `tools` (TRL's column: function schemas, a list or its JSON text) as a list, or None."""
    if tools is None or isinstance(tools, str) and not tools:
        return None
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except ValueError as e:
            raise ValueError(f"{where}: tools is not JSON: {e}") from None
    if not isinstance(tools, (list, tuple)) or not all(isinstance(t, dict) for t in tools):
        raise ValueError(f"{where}: tools must be a list of function schemas, got {type(tools).__name__}")
    return list(tools) or None


def render(tokenizer, messages: list[dict], where: str, tools: list[dict] | None = None) -> str:
    """The prompt text the model is sent: the tokenizer's chat template with the generation prompt (and the
    tool schemas, which a template lists in its system turn)."""
    try:
        return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    except Exception as e:  # noqa: BLE001 - the template is the model's, the messages the caller's
        raise ValueError(f"{where}: the chat template cannot render this prompt: {type(e).__name__}: {e}") from None


def turns(tokenizer, messages: list[dict], where: str, tools: list[dict] | None = None) -> list[tuple[str, bool]]:
    """A conversation as the chat template renders it, cut into (text, trained) pieces for SFT: the text
    up to the first assistant turn (the prompt) and between assistant turns is not trained; each assistant
    turn is, up to and with its end token (the tokenizer's eos; appended where the template writes none),
    and the template's text after that token is not. Each assistant turn is found as what rendering the
    conversation up to it adds to rendering the turns before it with the generation prompt; a template
    that does not render the conversation as such a continuation is refused."""
    eos = tokenizer.eos_token or ""
    if not any(m["role"] == "assistant" for m in messages):
        raise ValueError(f"{where}: the conversation has no assistant turn to learn")

    def text(upto: int, prompt: bool) -> str:
        try:
            return tokenizer.apply_chat_template(
                messages[:upto], tools=tools, tokenize=False, add_generation_prompt=prompt
            )
        except Exception as e:  # noqa: BLE001 - the template is the model's, the messages the caller's
            raise ValueError(f"{where}: the chat template cannot render it: {type(e).__name__}: {e}") from None

    pieces: list[tuple[str, bool]] = []
    done = ""
    for k, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before, after = text(k, True), text(k + 1, False)
        if not before.startswith(done) or not after.startswith(before):
            raise ValueError(
                f"{where}: the chat template does not render turn {k} as a continuation of the turns before it"
            )
        pieces.append((before[len(done) :], False))
        turn = after[len(before) :]
        end = turn.rfind(eos) + len(eos) if eos and eos in turn else len(turn)
        pieces.append((turn[:end] + ("" if eos and eos in turn else eos), True))
        if turn[end:]:
            pieces.append((turn[end:], False))
        done = after
    merged: list[tuple[str, bool]] = []  # the template's text between two turns is one piece, tokenized as
    for t, trained in pieces:  # a multi-turn run appends it (after_turn)
        if merged and merged[-1][1] == trained:
            merged[-1] = (merged[-1][0] + t, trained)
        elif t:
            merged.append((t, trained))
    return merged


def after_turn(tokenizer, messages: list[dict], tools: list[dict] | None = None) -> str:
    """The text the chat template writes after an assistant turn's end token up to the next assistant turn:
    the rest of the closed turn (ChatML's newline), `messages` (tool results, a user's reply) and the
    generation prompt. A multi-turn episode appends it as is, so the policy's own tokens stay as sampled.
    Found as what rendering a stand-in conversation with `messages` adds to rendering it without them."""
    eos = tokenizer.eos_token or ""
    base = [{"role": "user", "content": "1"}, {"role": "assistant", "content": "2"}]
    head = tokenizer.apply_chat_template(base, tools=tools, tokenize=False)
    full = tokenizer.apply_chat_template(base + messages, tools=tools, tokenize=False, add_generation_prompt=True)
    if not full.startswith(head) or eos not in head:
        raise ValueError("the chat template does not render tool results as a continuation of the turns before")
    return head[head.rfind(eos) + len(eos) :] + full[len(head) :]


def prompt_text(messages) -> str:
    """The prompt a scorer sees: the last user turn of chat messages (a reward model puts it into its
    own chat template), or the text itself."""
    if isinstance(messages, str):
        return messages
    users = [m.get("content", "") for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    return str(users[-1]) if users else ""
