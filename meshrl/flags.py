"""Command-line flags from a config dataclass: one --flag per field, and the dataclass back.

A field's help text is its comment in the source (`name: int = 0  # what it
does`, continued on `#   ...` lines) or the string literal below it, as the
config classes write them (field_docs), so flags and `--help` cannot drift
from the code.
"""

import argparse
import ast
import dataclasses
import inspect
import io
import json
import re
import textwrap
import tokenize

from meshrl.config.checked import FieldError


def field_docs(cls) -> dict[str, str]:
    """{field name: its documentation} read from the source of the class and of the classes it is composed
    of (a run section inherits its service's settings, and their documentation)."""
    docs: dict[str, str] = {}
    for base in reversed(cls.__mro__):
        if dataclasses.is_dataclass(base):
            docs.update(_own_docs(base))
    return docs


def _own_docs(cls) -> dict[str, str]:
    """{field name: its documentation} for the fields cls's own body declares; {} where there is none."""
    try:
        src = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    comments = {
        tok.start[0]: tok.string[1:]
        for tok in tokenize.generate_tokens(io.StringIO(src).readline)
        if tok.type == tokenize.COMMENT
    }
    lines = src.splitlines()
    node = ast.parse(src).body[0]
    if not isinstance(node, ast.ClassDef):
        return {}
    body = node.body
    docs = {}
    for i, node in enumerate(body):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        parts = []
        line = node.end_lineno
        if line in comments:
            parts.append(comments[line])
            line += 1  # comment-only lines indented past the '#' continue it
            while line in comments and lines[line - 1].strip().startswith("#") and comments[line].startswith("   "):
                parts.append(comments[line])
                line += 1
        nxt = body[i + 1] if i + 1 < len(body) else None
        if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
            parts.append(nxt.value.value)
        if parts:
            docs[node.target.id] = " ".join(" ".join(parts).split())
    return docs


def add_dataclass_flags(parser: argparse.ArgumentParser, cls, skip: tuple[str, ...] = ()) -> list[str]:
    """--field-name for each field of cls (bools become switches: --name, or --no-name where the default is
    on); returns the field names added."""
    names, docs = [], field_docs(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        flag = f"--{f.name.replace('_', '-')}"
        doc = docs.get(f.name, "").replace("%", "%%")
        if f.type is bool and f.default:  # on unless switched off
            parser.add_argument(
                f"--no-{f.name.replace('_', '-')}",
                dest=f.name,
                action="store_false",
                help=f"switch off: {doc}" if doc else None,
            )
        elif f.type is bool:
            parser.add_argument(flag, action="store_true", help=doc or None)
        else:
            parser.add_argument(
                flag,
                type=f.type if f.type in (int, float) else str,
                default=f.default,
                help=f"{doc} (default: %(default)s)" if doc else "default: %(default)s",
            )
        names.append(f.name)
    return names


def dataclass_args(cls, values: dict, skip: tuple[str, ...] = ()) -> list[str]:
    """The command line add_dataclass_flags(cls) parses back into `values` (the fields of cls found there;
    a switch only where it differs from its default): how a caller writes another process's flags
    without keeping its own copy of them."""
    out = []
    for f in dataclasses.fields(cls):
        if f.name in skip or f.name not in values or values[f.name] is None:  # None: the field's default
            continue
        value, flag = values[f.name], f.name.replace("_", "-")
        if f.type is bool:
            if bool(value) != bool(f.default):
                out.append(f"--{flag}" if value else f"--no-{flag}")
        else:
            out += [f"--{flag}", str(value)]
    return out


def dataclass_from_args(cls, args: argparse.Namespace, skip: tuple[str, ...] = ()):
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if f.name not in skip})


def as_flags(error: ValueError) -> str:
    """A settings class's refusal as its command line says it: `--world-size=0 must be ...`."""
    if isinstance(error, FieldError):
        return re.sub(r"\{(\w+)\}", lambda m: "--" + m.group(1).replace("_", "-"), error.template)
    return str(error)


def add_server_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (loopback unless told otherwise)")
    parser.add_argument("--port", type=int, default=0, help="0: any free port (printed)")
    parser.add_argument(
        "--token",
        default=None,
        help="require this bearer token on every call but health; "
        "better MESHRL_TOKEN or MESHRL_TOKEN_FILE in the environment (a command line is readable "
        "by every user of the machine)",
    )
    parser.add_argument(
        "--insecure-bind",
        action="store_true",
        help="allow a --host beyond loopback without TLS (MESHRL_TLS_DIR): any machine that "
        "reaches the port can call the service, and a token travels in clear text; also "
        "MESHRL_INSECURE_BIND=1",
    )


def settings_json(*configs) -> str:
    """A service's effective settings (its config dataclasses, merged) as JSON, for its Describe reply's
    details["settings"]: a run given the service by address compares them with its own config."""
    merged = {}
    for config in configs:
        merged.update(dataclasses.asdict(config))
    return json.dumps(merged, default=str, sort_keys=True)
