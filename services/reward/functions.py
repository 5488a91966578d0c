"""Scoring functions: load one by spec, call it, and check what it returned.

A spec is "builtin" (the data_source dispatcher) or "path/to/file.py:name", a
function with verl's signature:

    compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict

or, with batched=True, verl's batched form taking lists and returning a list:

    compute_score(data_sources, solution_strs, ground_truths, extra_infos) -> list[float | dict]

or TRL's reward function form (meshrl/reward_forms.py tells them apart by signature), batched always:

    reward_fn(completions, **kwargs) -> list[float | None]

As verl does, the arguments are passed by keyword, so their order in the
function's signature does not matter; a parameter the function does not
declare is not passed (unless it takes **kwargs), and a required parameter
with another name is an error when the function is loaded. TRL's form gets
prompts= and completions= (each the prompt as the dataset holds it, and for
chat prompts the completion as [{"role": "assistant", "content": text}]) and
the row's dataset columns by keyword, as TRL's GRPOTrainer calls it.

A result is a finite number, or a dict with a finite number under "score" and
extra per-sample values (numbers, bools, strings) beside it; for TRL's form
also None, "no score" (the sample scores 0 and is counted, see samples.py).
"""

import asyncio
import functools
import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from meshrl import reward_forms
from meshrl.loading import from_file

# one sample: verl's four arguments, and for TRL's form also the prompt as the dataset holds it (chat
# messages or text) and the row's dataset columns (TRL passes them by keyword)
Args = tuple  # (data_source, solution_str, ground_truth, extra_info[, prompt, columns])
PARAMS = reward_forms.VERL_PARAMS
BATCHED_PARAMS = reward_forms.VERL_BATCHED_PARAMS


def load(spec: str, batched: bool = False) -> Callable:
    """The function named by spec, called as f(data_source, solution_str, ground_truth, extra_info[, prompt,
    columns]) (lists of each when batched); it receives them by keyword, as verl passes them. A function of
    TRL's form comes back as a TRLCall, which is batched whatever `batched` says."""
    if spec == "builtin":
        from services.reward.scorers import default_compute_score

        return default_compute_score
    fn = from_file(spec)
    params = parameters(fn)
    if reward_forms.form(params, batched, spec) == "trl":
        assert params is not None  # form() reads a signature as TRL's only from its parameters
        return TRLCall(fn, params)
    return by_keyword(fn, BATCHED_PARAMS if batched else PARAMS, spec)


def is_batched(fn: Callable, batched: bool) -> bool:
    """A loaded function takes lists: verl's batched form, or TRL's."""
    return batched or isinstance(fn, TRLCall)


def parameters(fn: Callable) -> Mapping[str, inspect.Parameter] | None:
    try:
        return inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin or C function: nothing to read, pass them all
        return None


def by_keyword(fn: Callable, names: tuple[str, ...], spec: str) -> Callable:
    """fn wrapped to take `names` positionally and pass those it declares by keyword (arguments past
    `names`, TRL's prompt and columns, are not verl's and are dropped)."""
    params = parameters(fn)
    reward_forms.form(params, names == BATCHED_PARAMS, spec)  # ValueError for a signature verl cannot call
    passed = [n for n in names if params is None or reward_forms.takes_all(params) or n in params]

    @functools.wraps(fn)
    def call(*args):
        return fn(**{n: a for n, a in zip(names, args) if n in passed})

    return call


class TRLCall:
    """A TRL-form function, called with the columns of a batch of Args: reward_fn(prompts=, completions=,
    **dataset_columns) as TRL's GRPOTrainer calls it, each keyword only where the function declares it
    (all of them when it takes **kwargs). None in its result means "no score" (check_result)."""

    def __init__(self, fn: Callable, params: Mapping[str, inspect.Parameter]):
        self.fn, self.params = fn, params
        self.takes_all = reward_forms.takes_all(params)

    def __call__(self, data_sources, solution_strs, ground_truths, extra_infos, prompts, columns) -> Any:
        # TRL gives a chat prompt's completion as messages too (data_utils.is_conversational)
        completions = [
            [{"role": "assistant", "content": text}] if isinstance(prompt, list) else text
            for prompt, text in zip(prompts, solution_strs)
        ]
        kwargs: dict[str, Any] = {"prompts": list(prompts), "completions": completions}
        names = sorted({k for row in columns for k in row} - set(reward_forms.TRL_OWN))
        kwargs.update({k: [row.get(k) for row in columns] for k in names})
        result = self.fn(**{k: v for k, v in kwargs.items() if self.takes_all or k in self.params})
        return asyncio.run(result) if inspect.iscoroutine(result) else result  # TRL awaits an async one too


def check_result(result: Any, none_ok: bool = False) -> tuple[float | None, dict[str, Any]]:
    """(score, extras) from a function's result; ValueError saying what was wrong with it. none_ok (TRL's
    form): None is "no score", (None, {})."""
    if result is None and none_ok:
        return None, {}
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
