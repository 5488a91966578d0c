"""A verl launch script read as the verl config it gives, for `meshrl config from-verl`: the form verl ships
its examples in (examples/grpo_trainer/run_qwen2-7b.sh, the DAPO recipes).

    overrides, unread = read_script(text)   # {"actor_rollout_ref.rollout.n": 5, ...}, {key: (as written, why)}

The command (`python3 -m verl.trainer.main_ppo key=value ...`, backslash-continued) is split into words
as the shell splits it (quotes, escapes, comments, the end at a pipe or redirection), and each
`key=value` is read as Hydra reads it: a YAML scalar or list, a leading + or ++ dropped. A shell variable
is expanded only where the script gives it a value without running anything: a literal or integer
arithmetic (`n=16`, `len=$((1024 * 2))`, `bsz=$((len * 3))`) assigned at the top level before the
command. Anything else (`${MODEL_PATH:-...}` and `$HOME`, which are the environment's, `$(...)`, an
assignment inside a block) is not guessed: its key comes back in `unread` with the reason, so that
no default stands in for a value the script does set.
"""

import ast
import operator
import re

import yaml

from orchestrator.config import read_yaml
from orchestrator.verl_keys import ENTRY_POINTS

ASSIGNMENT = re.compile(r"^(\s*)(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
OPERATORS = "|;&<>"  # unquoted, they end the command
ARITHMETIC = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: lambda a, b: int(a / b),  # the shell's division truncates
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}


def is_script(text: str) -> bool:
    return any(entry in text for entry in ENTRY_POINTS)


def closing(text: str, start: int, open_: str, close: str) -> int:
    """The index just past the bracket that closes the one at start (len(text) when none does)."""
    depth = 0
    for i in range(start, len(text)):
        depth += (text[i] == open_) - (text[i] == close)
        if depth == 0:
            return i + 1
    return len(text)


def arithmetic(expr: str, env: dict[str, str]) -> int | None:
    """$((expr)) with integer literals and the script's variables; None where it needs anything else."""
    expr = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", r"\1", expr)
    expr = NAME.sub(lambda m: env.get(m.group(0), m.group(0)), expr)

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            return -value(node.operand) if isinstance(node.op, ast.USub) else value(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in ARITHMETIC:
            return ARITHMETIC[type(node.op)](value(node.left), value(node.right))
        raise ValueError(expr)

    try:
        return value(ast.parse(expr.strip(), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError):
        return None


def expansion(line: str, i: int, env: dict[str, str]) -> tuple[str, list[str], int]:
    """The `$...` at line[i]: (its value or, where unknown, its text; what it needed and lacks; the index
    past it)."""
    if line.startswith("$((", i):
        end = closing(line, i + 1, "(", ")")
        result = arithmetic(line[i + 3 : end - 2], env)
        return (line[i:end], [line[i:end]], end) if result is None else (str(result), [], end)
    if line.startswith("$(", i):
        end = closing(line, i + 1, "(", ")")
        return line[i:end], [line[i:end]], end
    if line.startswith("${", i):
        end = closing(line, i + 1, "{", "}")
        inner = line[i + 2 : end - 1]
        if NAME.fullmatch(inner) and inner in env:
            return env[inner], [], end
        return line[i:end], [line[i:end]], end
    m = NAME.match(line, i + 1) or re.compile(r"[@*#?$!0-9]").match(line, i + 1)
    if not m:
        return "$", [], i + 1
    if m.group(0) in env:
        return env[m.group(0)], [], m.end()
    return line[i : m.end()], [line[i : m.end()]], m.end()


def words(line: str, env: dict[str, str]) -> list[tuple[str, list[str]]]:
    """The shell's words of one logical line, each with the expansions it could not make; up to a comment,
    a pipe or a redirection."""
    out: list[tuple[str, list[str]]] = []
    word: list[str] = []
    missing: list[str] = []
    started, quote, i = False, "", 0
    while i < len(line):
        c = line[i]
        if quote == "'":
            quote = "" if c == "'" else quote
            word += [] if c == "'" else [c]
            i += 1
        elif c == "\\" and i + 1 < len(line):
            word += [c] if quote and line[i + 1] not in '$`"\\' else []
            word.append(line[i + 1])
            started, i = True, i + 2
        elif c == "$":
            text, lacks, i = expansion(line, i, env)
            word.append(text)
            missing += lacks
            started = True
        elif c in "\"'" and (not quote or c == quote):
            quote = "" if quote else c
            started, i = True, i + 1
        elif quote:
            word.append(c)
            i += 1
        elif c.isspace() or c in OPERATORS or (c == "#" and not started):
            if started and not (c in "<>" and "".join(word).isdigit()):  # 2>&1: a descriptor, not a word
                out.append(("".join(word), missing))
                word, missing, started = [], [], False
            if c in OPERATORS or c == "#":
                return out
            i += 1
        else:
            word.append(c)
            started, i = True, i + 1
    if started:
        out.append(("".join(word), missing))
    return out


def hydra_value(text: str) -> object:
    """A command-line value as Hydra reads it: YAML's scalars and flow lists (True, 1e-6 a float, null,
    ["console","wandb"]); '' for an empty value."""
    if not text:
        return ""
    try:
        return read_yaml(text)
    except yaml.YAMLError:
        return text


def read_script(text: str) -> tuple[dict[str, object], dict[str, tuple[str, str]]]:
    """({verl key: value} as the script's first verl command sets them, {key: (as written, why it is not
    read)})."""
    env: dict[str, str] = {}
    unknown: dict[str, str] = {}  # variables the script sets to what only running it would tell
    overrides: dict[str, object] = {}
    unread: dict[str, tuple[str, str]] = {}
    for line in re.sub(r"\\\r?\n", "", text).splitlines():  # the shell joins backslash-continued lines
        said = words(line, env)
        entry = next((i for i, (w, _) in enumerate(said) if w in ENTRY_POINTS), None)
        if entry is not None:
            for word, missing in said[entry + 1 :]:
                key, sep, value = word.partition("=")
                key = key.lstrip("+")
                if key.startswith("-"):
                    unread[key] = (value, "a Hydra option: verl's ppo_trainer config is assumed underneath")
                elif not sep or key.startswith("~"):
                    unread[word] = (word, "not a key=value setting: give it to meshrl as section.key=value")
                elif missing:
                    lacks = "; ".join(unknown.get(m.strip("${}"), f"{m} is not set in the script") for m in missing)
                    unread[key] = (value, f"needs the shell ({lacks}): not a literal the script sets")
                else:
                    overrides[key] = hydra_value(value)
            return overrides, unread
        m = ASSIGNMENT.match(line)
        if not m or line.lstrip().startswith("#"):
            continue
        indent, name, rest = m.groups()
        said_words = words(rest, env)
        value, missing = said_words[0] if said_words else ("", [])
        if indent or missing or len(said_words) > 1:  # in a block, from the environment, or a command
            env.pop(name, None)
            unknown[name] = f"{name}={rest.split(' #')[0].strip()}"
        else:
            env[name] = value
            unknown.pop(name, None)
    raise ValueError(f"no verl command ({' or '.join(ENTRY_POINTS)}) in the script")
