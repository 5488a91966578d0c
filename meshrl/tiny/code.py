"""The bundled code task: write a one-line Python function for a described integer mapping, graded by
running it on hidden inputs in the sandbox service (services/reward/scorers/code.py). Written as parquet
in verl's schema, seeded.

Each row: `prompt` = [{"role": "user", "content": "f: add 3, then times 2"}], `data_source` = "code",
`reward_model` = {"style": "rule", "ground_truth": JSON of {"fn_name": "f", "inputs": [[0], [1], ...],
"outputs": [...]}} (APPS's call cases), `extra_info` = {"split", "index", "answer"} where the answer,
"def f(x): return (x+3)*2", serves SFT. A mapping is two steps of add, subtract or times a digit; the
test split's mappings never appear in train.
"""

import dataclasses
import itertools
import json
import pathlib
import random

DATA_SOURCE = "code"
STEPS = {"add": "+", "subtract": "-", "times": "*"}
INPUTS = (0, 1, 4, -3, 10)  # the hidden inputs each answer is run on


@dataclasses.dataclass
class CodeConfig:
    num_test: int = 400  # mappings held out (test.parquet); the other 329 of the 729 are train.parquet's (400
    #   held out: a greedy accuracy's standard error ~2.4 points, where 200 left ~3.3)
    seed: int = 0  # which mappings are held out


def expression(steps: tuple) -> str:
    """The mapping as Python, written as a person would: (x+3)*2, x*2+3."""
    out, summed = "x", False
    for name, k in steps:
        op = STEPS[name]
        if op == "*" and summed:
            out = f"({out})"
        out, summed = f"{out}{op}{k}", op != "*"
    return out


def row(steps: tuple, split: str, index: int) -> dict:
    said = ", then ".join(f"{name} {k}" for name, k in steps)
    body = expression(steps)
    fn = eval(f"lambda x: {body}")  # noqa: S307 - our own expression of digits and + - *
    cases = {"fn_name": "f", "inputs": [[x] for x in INPUTS], "outputs": [fn(x) for x in INPUTS]}
    answer = f"def f(x): return {body}"
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"f: {said}"}],
        "ability": "code",
        "reward_model": {"style": "rule", "ground_truth": json.dumps(cases)},
        "extra_info": {"split": split, "index": index, "answer": answer},
    }


def make_data(out_dir: str | pathlib.Path, cfg: CodeConfig = CodeConfig()) -> dict[str, pathlib.Path]:
    import pandas as pd

    one = [(name, k) for name in STEPS for k in range(1, 10)]
    mappings = list(itertools.product(one, one))
    random.Random(cfg.seed).shuffle(mappings)
    splits = {"test": mappings[: cfg.num_test], "train": mappings[cfg.num_test :]}
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, chosen in splits.items():
        paths[split] = out / f"{split}.parquet"
        pd.DataFrame([row(s, split, i) for i, s in enumerate(chosen)]).to_parquet(paths[split])
    return paths
