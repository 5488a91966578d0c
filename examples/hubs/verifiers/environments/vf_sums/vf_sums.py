"""A verifiers environment written as verifiers' own examples are (a module with `load_environment`,
installed into the environment's venv), small enough for meshrl's tiny models: add two numbers, scored
by a rubric that compares the reply with the answer, plus half a point for a reply of digits (and, with
unique_weight, a group reward for a reply no other of its group gave). meshrl trains it through
examples/hubs/verifiers/meshrl_verifiers.py (docs/agents.md, "Environment hubs")."""

import random

import verifiers as vf
from datasets import Dataset


def problems(n: int, seed: int) -> Dataset:
    rng = random.Random(seed)
    pairs = [(rng.randint(0, 49), rng.randint(0, 49)) for _ in range(n)]
    return Dataset.from_list([{"question": f"{a}+{b}=", "answer": str(a + b)} for a, b in pairs])


def said(completion) -> str:
    """The reply's text: "" where the policy said nothing (verifiers then records no message)."""
    return str(completion[-1]["content"] or "") if completion else ""


def exact(completion, answer) -> float:
    """1 when the reply is the answer (spaces aside)."""
    return float(said(completion).strip() == answer)


def digits(completion) -> float:
    """The format reward: the share of the reply's characters that are digits."""
    text = said(completion)
    return sum(c.isdigit() for c in text) / len(text) if text else 0.0


def unique(completions) -> list[float]:
    """A group reward (verifiers calls it with the whole group's replies): 1 for a reply no other reply of
    its group gave, 0 for one another gave too."""
    texts = [said(c).strip() for c in completions]  # one that raised would zero the whole group (verifiers)
    return [float(texts.count(t) == 1) for t in texts]


def load_environment(num_train: int = 64, num_eval: int = 16, seed: int = 0, unique_weight: float = 0.0):
    """`unique_weight` > 0 adds `unique`, a group reward, with that weight."""
    funcs, weights = [exact, digits], [1.0, 0.5]
    if unique_weight:
        funcs, weights = [*funcs, unique], [*weights, unique_weight]
    rubric = vf.Rubric(funcs=funcs, weights=weights)
    return vf.SingleTurnEnv(
        dataset=problems(num_train, seed),
        eval_dataset=problems(num_eval, seed + 1),
        rubric=rubric,
        pass_threshold=1.0,  # right, not only digits
    )
