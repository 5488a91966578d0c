"""Scoring functions: load one by spec, call it, and check what it returned.

A spec is "builtin" (the data_source dispatcher) or "path/to/file.py:name", a
function with verl's signature:

    compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict

or, with batched=True, verl's batched form taking lists and returning a list:

    compute_score(data_sources, solution_strs, ground_truths, extra_infos) -> list[float | dict]

A result is a finite number, or a dict with a finite number under "score" and
extra per-sample values (numbers, bools, strings) beside it.
"""

import importlib.util
import math
import pathlib
import sys
from typing import Any, Callable

import numpy as np

Args = tuple[Any, str, Any, Any]  # (data_source, solution_str, ground_truth, extra_info)


def load(spec: str) -> Callable:
    if spec == "builtin":
        from services.reward.scorers import default_compute_score

        return default_compute_score
    path, sep, name = spec.rpartition(":")
    if not sep or not path or not name:
        raise ValueError(f"function spec {spec!r} must look like path/to/file.py:function_name")
    file = pathlib.Path(path).expanduser().resolve()
    if not file.is_file():
        raise ValueError(f"reward function file {str(file)!r} does not exist")
    module_name = f"meshrl_user_reward_{abs(hash(str(file)))}"
    module_spec = importlib.util.spec_from_file_location(module_name, file)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module  # dataclasses and pickling-free helpers in user code need it
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:
        raise ValueError(f"could not import {file}: {type(e).__name__}: {e}") from e
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"{file} has no function {name!r}")
    return fn


def check_result(result: Any) -> tuple[float, dict[str, Any]]:
    """(score, extras) from a function's result; ValueError saying what was wrong with it."""
    extras: dict[str, Any] = {}
    if isinstance(result, dict):
        if "score" not in result:
            raise ValueError(f"the function returned a dict without 'score' (keys: {sorted(result)})")
        extras = {k: _extra(k, v) for k, v in result.items() if k != "score"}
        result = result["score"]
    if isinstance(result, np.generic) or (type(result).__name__ == "Tensor" and result.numel() == 1):
        result = result.item()  # numpy or torch scalar
    if isinstance(result, bool) or not isinstance(result, (int, float)):
        raise ValueError(f"the function returned a {type(result).__name__} ({result!r:.80}), expected a number "
                         "or a dict with a number under 'score'")
    if not math.isfinite(result):
        raise ValueError(f"the function returned {result}, expected a finite number")
    return float(result), extras


def _extra(key: str, value: Any) -> Any:
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise ValueError(f"extra {key!r} is a {type(value).__name__}; extras must be numbers, bools or strings")
