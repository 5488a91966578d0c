"""The bundled arithmetic task: the response's first line must be the integer answer.

"19" and " 19\nbecause..." score for ground truth "19"; "19.0", "nineteen" and
"the answer is 19" do not (format_ok is False for them). Exact answers make the
tiny default run's reward unambiguous.
"""

import re

_INT = re.compile(r"[+-]?\d+")


def compute_score(data_source, solution_str, ground_truth, extra_info=None, score=1.0, format_score=0.0):
    first_line = solution_str.strip().split("\n", 1)[0].strip()
    format_ok = bool(_INT.fullmatch(first_line))
    acc = format_ok and int(first_line) == int(str(ground_truth).strip())
    return {"score": score if acc else (format_score if format_ok else 0.0), "acc": acc, "format_ok": format_ok}
