"""Build a typed config dataclass from a plain dict, refusing what does not fit.

Unknown keys and wrong types are ValueErrors that name the key (`where.key`).
Ints are accepted for float fields; lists for tuple fields; nothing else is
coerced (a string is not a number, a number is not a bool).
"""

import dataclasses
import types
import typing
from typing import Any

from meshrl.config.checked import FieldError


def build(cls, data: dict[str, Any], where: str):
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; known: {sorted(fields)}")
    hints = typing.get_type_hints(cls)
    values = {k: _check(v, hints[k], f"{where}.{k}") for k, v in data.items()}
    try:
        return cls(**values)
    except FieldError as e:  # names its keys: section.key
        raise ValueError(e.named(where)) from None
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from None


def _check(value: Any, hint, where: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _check(value, option, where)
            except ValueError as e:
                errors.append(str(e))
        raise ValueError(errors[0] if errors else f"{where}: None is not allowed")
    if origin is tuple:
        args = typing.get_args(hint)
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise ValueError(f"{where}: expected a list of {len(args)}, got {value!r}")
        return tuple(_check(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    if origin is list:
        (arg,) = typing.get_args(hint)
        if not isinstance(value, list):
            raise ValueError(f"{where}: expected a list, got {value!r}")
        return [_check(v, arg, f"{where}[{i}]") for i, v in enumerate(value)]
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is int and isinstance(value, bool) or hint is float and isinstance(value, bool):
        raise ValueError(f"{where}: expected {hint.__name__}, got a bool")
    if hint in (int, float, str, bool) and not isinstance(value, hint):
        raise ValueError(f"{where}: expected {hint.__name__}, got {type(value).__name__} {value!r}")
    return value
