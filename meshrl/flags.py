"""Command-line flags from a config dataclass: one --flag per field, and the dataclass back."""

import argparse
import dataclasses


def add_dataclass_flags(parser: argparse.ArgumentParser, cls, skip: tuple[str, ...] = ()) -> list[str]:
    """--field-name for each field of cls (bools become switches); returns the field names added."""
    names = []
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        flag = f"--{f.name.replace('_', '-')}"
        if f.type is bool:
            parser.add_argument(flag, action="store_true")
        else:
            parser.add_argument(flag, type=f.type if f.type in (int, float) else str, default=f.default)
        names.append(f.name)
    return names


def dataclass_from_args(cls, args: argparse.Namespace, skip: tuple[str, ...] = ()):
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if f.name not in skip})


def add_server_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (loopback unless told otherwise)")
    parser.add_argument("--port", type=int, default=0, help="0: any free port (printed)")
    parser.add_argument("--token", default=None, help="require this bearer token on every call but health")
