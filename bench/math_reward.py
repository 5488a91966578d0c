"""A verl-style user reward function for the reward benchmark: \\boxed{} answers checked by math-verify."""

from math_verify import parse, verify


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    gold = parse(f"\\boxed{{{ground_truth}}}")
    pred = parse(solution_str)
    return 1.0 if gold and pred and verify(gold, pred) else 0.0
