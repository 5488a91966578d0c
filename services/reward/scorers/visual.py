"""The bundled visual task (meshrl/tiny/visual.py): the response's first line must name the shape as the
ground truth does, "red circle": words compared without case or extra spaces. "Red  Circle\n..." scores;
"a red circle" and "red" do not (format_ok says whether it has the answer's number of words).
"""


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    first = solution_str.strip().split("\n", 1)[0].lower().split()
    truth = str(ground_truth).lower().split()
    acc = first == truth
    return {"score": 1.0 if acc else 0.0, "acc": acc, "format_ok": len(first) == len(truth)}
