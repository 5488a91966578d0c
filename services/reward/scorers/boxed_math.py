"""Competition math: the last \\boxed{...} answer, checked for equivalence with math-verify.

math-verify (HuggingFace) parses LaTeX and compares expressions symbolically
("\\frac{1}{2}" == "0.5"). Its timeouts use SIGALRM, which works only in a
process's main thread: in the reward service's worker processes they are on;
elsewhere they are turned off. Without math-verify installed, answers compare
as normalized strings.
"""

import threading

try:
    from math_verify import parse, verify
except ImportError:  # optional: fall back to string comparison
    parse = verify = None

_STRIP = ["\\left", "\\right", "\\!", "\\,", "\\;", "$", " "]


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}), braces balanced; None if there is none."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None  # unbalanced: the answer was cut off


def normalize(answer: str) -> str:
    for s in _STRIP:
        answer = answer.replace(s, "")
    return answer.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").rstrip(".")


def equivalent(answer: str, ground_truth: str) -> bool:
    if normalize(answer) == normalize(ground_truth):
        return True
    if verify is None:
        return False
    main = threading.current_thread() is threading.main_thread()
    timeout = 5 if main else None  # SIGALRM-based: main thread only
    gold = parse(f"\\boxed{{{ground_truth}}}", parsing_timeout=timeout)
    pred = parse(f"\\boxed{{{answer}}}", parsing_timeout=timeout)
    return bool(gold and pred and verify(gold, pred, timeout_seconds=timeout))


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    answer = last_boxed(solution_str)
    if answer is None:
        return {"score": 0.0, "acc": False, "format_ok": False}
    acc = equivalent(answer, str(ground_truth))
    return {"score": 1.0 if acc else 0.0, "acc": acc, "format_ok": True}
