"""Scoring functions: load one by spec, call it, and check what it returned.

A spec is "builtin" (the data_source dispatcher) or "path/to/file.py:name", a
function with verl's signature:

    compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict

or, with batched=True, verl's batched form taking lists and returning a list:

    compute_score(data_sources, solution_strs, ground_truths, extra_infos) -> list[float | dict]

As verl does, the arguments are passed by keyword, so their order in the
function's signature does not matter; a parameter the function does not
declare is not passed (unless it takes **kwargs), and a required parameter
with another name is an error when the function is loaded.

A result is a finite number, or a dict with a finite number under "score" and
extra per-sample values (numbers, bools, strings) beside it.
"""

import functools
import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from meshrl.loading import from_file

Args = tuple[Any, str, Any, Any]  # (data_source, solution_str, ground_truth, extra_info)
PARAMS = ("data_source", "solution_str", "ground_truth", "extra_info")
BATCHED_PARAMS = ("data_sources", "solution_strs", "ground_truths", "extra_infos")


def load(spec: str, batched: bool = False) -> Callable:
    """The function named by spec, called as f(data_source, solution_str, ground_truth, extra_info)
    (lists of each when batched); it receives them by keyword, as verl passes them."""
    if spec == "builtin":
        from services.reward.scorers import default_compute_score

        return default_compute_score
    return by_keyword(from_file(spec), BATCHED_PARAMS if batched else PARAMS, spec)


def by_keyword(fn: Callable, names: tuple[str, ...], spec: str) -> Callable:
    """fn wrapped to take `names` positionally and pass those it declares by keyword."""
    params: Mapping[str, inspect.Parameter]
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin or C function: nothing to read, pass them all
        params = {}
    takes_all = not params or any(p.kind is p.VAR_KEYWORD for p in params.values())
    unknown = [
        n
        for n, p in params.items()
        if n not in names and p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    positional_only = [n for n, p in params.items() if p.kind is p.POSITIONAL_ONLY]
    if not takes_all and names[1] not in params:  # it could not see the response it scores
        unknown = unknown or [f"(no {names[1]})"]
    if unknown or positional_only:
        raise ValueError(
            f"{spec}: parameter(s) {unknown or positional_only} are not what verl passes; "
            f"it calls compute_score({', '.join(f'{n}=...' for n in names)}) by keyword"
        )
    passed = [n for n in names if takes_all or n in params]

    @functools.wraps(fn)
    def call(*args):
        return fn(**{n: a for n, a in zip(names, args) if n in passed})

    return call


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
        raise ValueError(
            f"the function returned a {type(result).__name__} ({result!r:.80}), expected a number "
            "or a dict with a number under 'score'"
        )
    if not math.isfinite(result):
        raise ValueError(f"the function returned {result}, expected a finite number")
    return float(result), extras


def _extra(key: str, value: Any) -> Any:
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise ValueError(f"extra {key!r} is a {type(value).__name__}; extras must be numbers, bools or strings")
