"""Python values <-> meshrl.v1.Value: None, bool, int, float, str, bytes, lists, dicts.

Ints stay ints and floats stay floats (google.protobuf.Value would turn 3 into 3.0).
numpy scalars and arrays become their Python equivalents; anything else is an error
naming where it was found, never a silent str() or a pickle.
"""

from typing import Any

import numpy as np

from meshrl.v1 import data_pb2 as pb


def to_value(x: Any, where: str) -> pb.Value:
    v = pb.Value()
    _fill(v, x, where)
    return v


def _fill(v: pb.Value, x: Any, where: str) -> None:
    if isinstance(x, np.generic):
        x = x.item()
    elif isinstance(x, np.ndarray):
        x = x.tolist()
    if x is None:
        v.null_value = True
    elif isinstance(x, bool):
        v.bool_value = x
    elif isinstance(x, int):
        if not -(2**63) <= x < 2**63:
            raise ValueError(f"{where}: int {x} does not fit in 64 bits")
        v.int_value = x
    elif isinstance(x, float):
        v.float_value = x
    elif isinstance(x, str):
        v.string_value = x
    elif isinstance(x, (bytes, bytearray, memoryview)):
        v.bytes_value = bytes(x)
    elif isinstance(x, (list, tuple)):
        lv = v.list_value
        lv.SetInParent()  # an empty list is still a list, not an unset value
        for i, item in enumerate(x):
            _fill(lv.values.add(), item, f"{where}[{i}]")
    elif isinstance(x, dict):
        mv = v.map_value
        mv.SetInParent()
        for k, item in x.items():
            if not isinstance(k, str):
                raise ValueError(f"{where}: dict keys must be strings, got {type(k).__name__} {k!r}")
            _fill(mv.fields[k], item, f"{where}[{k!r}]")
    else:
        raise ValueError(
            f"{where}: a {type(x).__name__} cannot travel; use None, bool, int, float, "
            "str, bytes, or lists/dicts of them"
        )


def from_value(v: pb.Value, where: str) -> Any:
    kind = v.WhichOneof("kind")
    if kind is None:
        raise ValueError(f"{where}: value has no kind set")
    if kind == "null_value":
        return None
    if kind == "list_value":
        return [from_value(item, f"{where}[{i}]") for i, item in enumerate(v.list_value.values)]
    if kind == "map_value":
        return {k: from_value(item, f"{where}[{k!r}]") for k, item in v.map_value.fields.items()}
    return getattr(v, kind)


_TYPED = (("strings", str), ("ints", int), ("floats", float), ("bools", bool))


def to_column(values: list, where: str) -> pb.Column:
    """A Column in a typed list when all values share one plain type, else one Value per row."""
    col = pb.Column()
    kinds = {type(v) for v in values}
    for field, kind in _TYPED:
        if kinds == {kind}:
            if kind is int and any(not -(2**63) <= v < 2**63 for v in values):
                break
            getattr(col, field).extend(values)
            return col
    col.values.extend(to_value(v, f"{where} row {i}") for i, v in enumerate(values))
    return col


def from_column(col: pb.Column, where: str) -> list:
    filled = [f for f in ("values", "strings", "ints", "floats", "bools") if len(getattr(col, f))]
    if len(filled) > 1:
        raise ValueError(f"{where}: column holds values in more than one list ({', '.join(filled)})")
    if not filled or filled[0] == "values":
        return [from_value(v, f"{where} row {i}") for i, v in enumerate(col.values)]
    return list(getattr(col, filled[0]))
