"""Built-in rule scorers, each with verl's signature, picked per sample by data_source.

    compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict

`default_compute_score` is the dispatcher, as verl's is; BY_DATA_SOURCE is the
explicit table (no registration at import time).

- arithmetic: the bundled arithmetic task, the integer answer on the response's first line.
- gsm8k: GSM8K, the answer after '#### ' (strict) or the last number (flexible).
- boxed_math: competition math, the last \\boxed{...} answer checked for equivalence with math-verify.
- format_reward: whether the response follows a required layout (R1-style think/answer, or a row's regex).
- visual: the bundled visual task (meshrl/tiny/visual.py), the shape named on the response's first line.
- code: the response's program run against the row's test cases in the sandbox service (reward.sandbox);
  asserts: its assert-style cases made hard to pass without the answer.
"""

from collections.abc import Callable
from typing import Any

from meshrl.clients.sandbox import CODE_SOURCES
from services.reward.scorers import arithmetic, boxed_math, code, format_reward, gsm8k, visual

# compute_score(data_source, solution_str, ground_truth, extra_info) of each
BY_DATA_SOURCE: dict[str, Callable[[Any, str, Any, Any], Any]] = {
    "arithmetic": arithmetic.compute_score,
    "openai/gsm8k": gsm8k.compute_score,
    "gsm8k": gsm8k.compute_score,
    "lighteval/MATH": boxed_math.compute_score,
    "DigitalLearningGmbH/MATH-lighteval": boxed_math.compute_score,
    "HuggingFaceH4/MATH-500": boxed_math.compute_score,
    "math": boxed_math.compute_score,
    "format": format_reward.compute_score,
    "visual": visual.compute_score,  # the bundled visual task (meshrl/tiny/visual.py)
    **dict.fromkeys(CODE_SOURCES, code.compute_score),  # run in the sandbox service
}


def default_compute_score(data_source, solution_str, ground_truth, extra_info=None):
    fn = BY_DATA_SOURCE.get(data_source)
    if fn is None:
        raise ValueError(
            f"no built-in scorer for data_source {data_source!r}; built-in: {sorted(BY_DATA_SOURCE)}; "
            "pass a user function (--function file.py:name) for others"
        )
    if ground_truth is None:
        raise ValueError("reward_model.ground_truth is missing")
    return fn(data_source, solution_str, ground_truth, extra_info)
