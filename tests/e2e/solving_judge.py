"""A judge program for the judge's learning test (tests/e2e/test_learning.py): the judge answers each
question itself, and an answer is right when the judge's is the same. A reference-free judge: it never
sees the ground truth."""


def judge(samples, ask):
    said = ask([s["prompt"] for s in samples])
    return [float(t.strip() == s["response"].strip()) for s, t in zip(samples, said)]
