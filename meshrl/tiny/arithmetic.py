"""The bundled arithmetic task, written as parquet in verl's schema, seeded.

Each row: `prompt` = [{"role": "user", "content": "12+7="}], `data_source` =
"arithmetic", `ability` = "math", `reward_model` = {"style": "rule",
"ground_truth": "19"}, `extra_info` = {"split", "index", "question", "answer"}
(question/answer also serve SFT, as in verl's GSM8K preprocessing). Test
problems never appear in the train split.

The tool task (tool=True) has two formats. "text": the SFT answer is a calculator trace written out,
"<calc>12*7</calc><result>84</result>84". "hermes": the model's chat template carries it, the format
of Qwen2.5/Qwen3 (meshrl/tiny/bpe.py): train rows also get `messages`, the whole conversation for SFT
(data.prompt_key=messages), with an assistant turn calling the `calculator` tool (CALCULATOR, an
OpenAI function schema), its tool result, and the answer; every row gets `tools`, the schemas as JSON
(TRL's column), which the template lists in the system turn.
"""

import dataclasses
import itertools
import json
import pathlib
import random
from typing import Any

DATA_SOURCE = "arithmetic"
OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
FORMATS = ("text", "hermes")
CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "integer arithmetic",  # short: every prompt of a tiny model's run carries it
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}


@dataclasses.dataclass
class ArithmeticConfig:
    # The defaults are the main job's task: 2,500 sums of 0..49, 500 of them held out. Big enough that a
    # model must learn to add (not recall) to answer the held-out ones, and that one accuracy reading has
    # a standard error of ~2 points.
    num_train: int = 2000  # rows of train.parquet
    num_test: int = 500  # rows of test.parquet, none of them in train
    max_operand: int = 49  # operands are drawn from 0..max_operand
    ops: str = "+"  # any of + - *
    seed: int = 0  # which problems are drawn
    tool: bool = False  # the SFT answer is a calculator trace, "<calc>12*7</calc><result>84</result>84" (the
    #   bundled tool task, services/env/calculator.py); the ground truth stays the number
    tool_share: float = 1.0  # with tool: the share of training rows whose SFT answer is a trace (a seeded
    #   draw); the others answer directly, so a warm-up leaves the policy calling the tool only sometimes
    tool_format: str = "text"  # with tool: "text" (traces written out) or "hermes" (the chat template's
    #   tool calls and tool role; train rows get `messages` and `tools`)


def problems(cfg: ArithmeticConfig) -> tuple[list[tuple], list[tuple]]:
    """(train, test) lists of (a, op, b); test is distinct from train."""
    bad = set(cfg.ops) - set(OPS)
    if bad or not cfg.ops:
        raise ValueError(f"ops must be a non-empty string of {''.join(OPS)}, got {cfg.ops!r}")
    if not 0 <= cfg.tool_share <= 1:
        raise ValueError(f"tool_share must be in [0, 1], got {cfg.tool_share}")
    if cfg.tool_format not in FORMATS:
        raise ValueError(f"tool_format must be one of {FORMATS}, got {cfg.tool_format!r}")
    if cfg.max_operand < 0 or cfg.num_train < 0 or cfg.num_test < 0:
        raise ValueError("max_operand, num_train and num_test must be >= 0")
    space = list(itertools.product(range(cfg.max_operand + 1), sorted(set(cfg.ops)), range(cfg.max_operand + 1)))
    if cfg.num_test >= len(space):
        raise ValueError(
            f"num_test {cfg.num_test} leaves no training problems out of {len(space)}; "
            "raise max_operand or lower num_test"
        )
    rng = random.Random(cfg.seed)
    rng.shuffle(space)
    test, pool = space[: cfg.num_test], space[cfg.num_test :]
    if cfg.num_train <= len(pool):
        train = pool[: cfg.num_train]
    else:  # a small problem space: draw with replacement
        train = [rng.choice(pool) for _ in range(cfg.num_train)]
    return [(a, op, b) for a, op, b in train], [(a, op, b) for a, op, b in test]


def rows(items: list[tuple], split: str, cfg: ArithmeticConfig, tool_share: float) -> list[dict]:
    out, rng = [], random.Random(cfg.seed + 1)
    for i, (a, op, b) in enumerate(items):
        question, truth = f"{a}{op}{b}=", str(OPS[op](a, b))
        traced = cfg.tool and rng.random() < tool_share
        answer = f"<calc>{a}{op}{b}</calc><result>{truth}</result>{truth}" if traced else truth
        if cfg.tool and cfg.tool_format == "hermes":
            answer = truth  # the trace is in `messages`
        row: dict[str, Any] = {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": question}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": truth},
            "extra_info": {"split": split, "index": i, "question": question, "answer": answer},
        }
        if cfg.tool and cfg.tool_format == "hermes":
            row["tools"] = json.dumps([CALCULATOR])
            if split == "train":
                row["messages"] = conversation(question, f"{a}{op}{b}", truth, traced)
        out.append(row)
    return out


def conversation(question: str, expression: str, truth: str, traced: bool) -> list[dict]:
    """A solved problem as chat messages: with traced, a calculator call and its result come first."""
    user = {"role": "user", "content": question}
    if not traced:
        return [user, {"role": "assistant", "content": truth}]
    call = {"type": "function", "function": {"name": "calculator", "arguments": json.dumps({"expression": expression})}}
    return [
        user,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": truth},
        {"role": "assistant", "content": truth},
    ]


def corpus(cfg: ArithmeticConfig, chat_template: str, size: int = 2000) -> list[str]:
    """Text to train a tokenizer on: the task's problems rendered through chat_template as conversations,
    half with the calculator listed and called, half plain."""
    from transformers.utils.chat_template_utils import render_jinja_template

    rng = random.Random(cfg.seed)
    texts = []
    for k in range(size):
        a, op, b = rng.randint(0, cfg.max_operand), rng.choice(sorted(set(cfg.ops))), rng.randint(0, cfg.max_operand)
        messages = conversation(f"{a}{op}{b}=", f"{a}{op}{b}", str(OPS[op](a, b)), traced=k % 2 == 0)
        rendered = render_jinja_template(
            [messages], tools=[CALCULATOR] if k % 2 == 0 else None, chat_template=chat_template
        )[0]  # (texts, generation indices)
        texts.append(rendered[0])
    return texts


def make_data(out_dir: str | pathlib.Path, cfg: ArithmeticConfig = ArithmeticConfig()) -> dict[str, pathlib.Path]:
    """Write train.parquet and test.parquet into out_dir; returns their paths."""
    import pandas as pd  # here: `meshrl --help` reads ArithmeticConfig without pandas

    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train, test = problems(cfg)
    paths = {}
    for split, items in (("train", train), ("test", test)):
        paths[split] = out / f"{split}.parquet"
        share = cfg.tool_share if split == "train" else 1.0
        pd.DataFrame(rows(items, split, cfg, share)).to_parquet(paths[split], index=False)
    return paths
