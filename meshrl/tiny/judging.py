"""The bundled task's judge data: a tiny model taught to say whether an answer to a sum is right.

Each training problem of the arithmetic task (meshrl/tiny/arithmetic.py, same seed, same split) gives two
SFT rows, its right answer and a wrong one, asked as the judge's rubric for the task asks, with the
reference answer (`12+7=18?19`: the question, the answer, the ground truth), the target `yes` or `no`. The
wrong answers are the kinds a half-trained policy gives: off by one to three, a tens digit off by one, or
any other number. A tiny model does not learn to check a sum outright in a warm-up's time (it must add
first, which it half knows); checking an answer against a reference, as a reference-guided judge does, it
learns. The judge fine-tuned on these grades the policy in tests/e2e/test_judge_learning.py, with no rule
reward.

    make_judge_data("data/judge", ArithmeticConfig())     # train.parquet: 2 rows a problem; test.parquet
"""

import pathlib
import random

from meshrl.tiny.arithmetic import OPS, ArithmeticConfig, problems

TEMPLATE = "{prompt}{response}?{ground_truth}"  # the judge's prompt: the question, the answer, the reference
VERDICTS = {"yes": 1.0, "no": 0.0}


def wrong(truth: int, rng: random.Random) -> int:
    """A wrong answer of the kinds a half-trained policy gives."""
    while True:
        kind = rng.random()
        if kind < 0.4:
            guess = truth + rng.choice([-3, -2, -1, 1, 2, 3])
        elif kind < 0.7:
            guess = truth + rng.choice([-10, 10])
        else:
            guess = rng.randrange(0, 2 * max(truth, 50))
        if guess != truth and guess >= 0:
            return guess


def judge_rows(items: list[tuple], split: str, seed: int) -> list[dict]:
    rng = random.Random(seed + 2)
    out: list[dict] = []
    for a, op, b in items:
        truth = OPS[op](a, b)
        for answer, verdict in ((truth, "yes"), (wrong(truth, rng), "no")):
            question = TEMPLATE.format(prompt=f"{a}{op}{b}=", response=answer, ground_truth=truth)
            out.append(
                {
                    "data_source": "arithmetic_judge",
                    "prompt": [{"role": "user", "content": question}],
                    "reward_model": {"style": "rule", "ground_truth": verdict},
                    "extra_info": {"split": split, "index": len(out), "question": question, "answer": verdict},
                }
            )
    return out


def make_judge_data(out_dir: str | pathlib.Path, cfg: ArithmeticConfig = ArithmeticConfig()) -> dict[str, pathlib.Path]:
    """train.parquet (the task's training problems) and test.parquet (its held-out ones), two rows each."""
    import pandas as pd  # here: `meshrl --help` does not import pandas

    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, items in zip(("train", "test"), problems(cfg)):
        paths[split] = out / f"{split}.parquet"
        pd.DataFrame(judge_rows(items, split, cfg.seed)).to_parquet(paths[split], index=False)
    return paths
