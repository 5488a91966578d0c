"""GSM8K: the answer follows '#### ' (strict) or is the last number in the response (flexible).

As in verl's scorer, only the last 300 characters are searched (long responses
are slow to regex) and commas and '$' are dropped. Where verl's strict mode takes
the first '####', this takes the last: a model that restates its answer means
the final one. Numbers compare by value ("18" == "18.0"), strings otherwise.
"""

import re

_STRICT = re.compile(r"####\s*(-?[\d.,$]+)")
_NUMBER = re.compile(r"-?[\d.,$]*\d[\d.,$]*")
CLIP_CHARS = 300


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    text = solution_str[-CLIP_CHARS:]
    if method == "strict":
        found = _STRICT.findall(text)
    elif method == "flexible":
        found = _NUMBER.findall(text)
    else:
        raise ValueError(f"method must be 'strict' or 'flexible', got {method!r}")
    if not found:
        return None
    return found[-1].replace(",", "").replace("$", "").rstrip(".")


def same_answer(a: str, b: str) -> bool:
    a, b = a.replace(",", "").strip(), b.replace(",", "").strip()
    try:
        return abs(float(a) - float(b)) < 1e-6
    except ValueError:
        return a == b


def compute_score(  # limit: verl's gsm8k scorer's signature, which users call positionally
    data_source, solution_str, ground_truth, extra_info=None, method="strict", format_score=0.0, score=1.0
):
    # verl's signature for this scorer (verl/utils/reward_score/gsm8k.py), positional as user code calls it
    answer = extract_solution(solution_str, method)
    if answer is None:
        return {"score": 0.0, "acc": False, "format_ok": False}
    acc = same_answer(answer, str(ground_truth))
    return {"score": score if acc else format_score, "acc": acc, "format_ok": True}
