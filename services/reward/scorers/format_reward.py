"""Format reward: does the response follow a required layout?

By default the R1-style `<think>...</think>` then `<answer>...</answer>`; a row
may give its own regular expression in extra_info["format_pattern"]. The whole
response (surrounding whitespace aside) must match.
"""

import re

DEFAULT_PATTERN = r"<think>.*?</think>\s*<answer>.*?</answer>"


def compute_score(data_source, solution_str, ground_truth=None, extra_info=None, score=1.0):
    pattern = (extra_info or {}).get("format_pattern") or DEFAULT_PATTERN
    ok = re.fullmatch(pattern, solution_str.strip(), flags=re.DOTALL) is not None
    return {"score": score if ok else 0.0, "format_ok": ok}
