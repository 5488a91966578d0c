"""What a judge is asked and how its answer is read: the rubric templates, the named parsers, and the
pairwise program that turns a group's head-to-head judgements into scores.

    text = template_text(cfg)                      # the rubric: judge.template, a file, or the default
    ask = pointwise_prompts(text, samples)         # one prompt per sample
    score = read(cfg, judgement)                   # 0..1, or None: unparseable
    pairs = pairwise_pairs(samples)                # (i, j) of each group, both orders, equal answers left out
    scores = win_shares(len(samples), pairs, prefs)
"""

import json
import math
import pathlib
import re
import string

POINTWISE = (
    "You are grading an answer.\n\nQuestion: {prompt}\n\nAnswer: {response}\n\nIs the answer correct? Reply yes or no."
)
PAIRWISE = (
    "You are comparing two answers to one question.\n\nQuestion: {prompt}\n\nAnswer A: {response_a}\n\n"
    "Answer B: {response_b}\n\nWhich answer is better? Reply A or B."
)
FIELDS = {
    "pointwise": {"prompt", "response", "ground_truth"},
    "pairwise": {"prompt", "response_a", "response_b", "ground_truth"},
}
NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
WORD = re.compile(r"[A-Za-z]+")


def template_text(template: str, mode: str) -> str:
    """The rubric: judge.template as text, or the file it names, or the mode's default; ValueError naming a
    field the mode does not fill."""
    text = template or (PAIRWISE if mode == "pairwise" else POINTWISE)
    if template and "{" not in template and pathlib.Path(template).expanduser().is_file():
        text = pathlib.Path(template).expanduser().read_text()
    try:
        used = {name for _, name, _, _ in string.Formatter().parse(text) if name is not None}
    except ValueError as e:
        raise ValueError(f"judge.template: {e} (write a literal brace as {{{{ or }}}})") from None
    unknown = sorted(used - FIELDS[mode])
    if unknown:
        raise ValueError(f"judge.template: {unknown} are not fields of a {mode} prompt; it has {sorted(FIELDS[mode])}")
    return text


def pointwise_prompts(text: str, samples: list[dict]) -> list[str]:
    return [text.format(**{k: s[k] for k in ("prompt", "response", "ground_truth")}) for s in samples]


def pairwise_pairs(samples: list[dict]) -> list[tuple[int, int]]:
    """Each two samples of one group (same uid) in both orders (a judge's bias for the first answer shown
    cancels), but not two equal answers: they tie without asking."""
    groups: dict = {}
    for i, s in enumerate(samples):
        groups.setdefault(s["uid"], []).append(i)
    return [
        (i, j)
        for members in groups.values()
        for i in members
        for j in members
        if i != j and samples[i]["response"] != samples[j]["response"]
    ]


def pairwise_prompts(text: str, samples: list[dict], pairs: list[tuple[int, int]]) -> list[str]:
    return [
        text.format(
            prompt=samples[i]["prompt"],
            response_a=samples[i]["response"],
            response_b=samples[j]["response"],
            ground_truth=samples[i]["ground_truth"],
        )
        for i, j in pairs
    ]


def win_shares(n: int, pairs: list[tuple[int, int]], prefs: list[float | None]) -> list[float]:
    """Each sample's score: its share of the comparisons it took part in that it won (a preference p for
    A counts p for A and 1 - p for B); a sample compared with nothing (alone, or every other answer
    equal to it), or whose comparisons were all unparseable, gets 0.5."""
    won, took = [0.0] * n, [0] * n
    for (i, j), p in zip(pairs, prefs):
        if p is None:
            continue
        won[i] += p
        won[j] += 1 - p
        took[i] += 1
        took[j] += 1
    return [w / t if t else 0.5 for w, t in zip(won, took)]


def read(parser: str, text: str, yes: list[str], no: list[str], scale: tuple[float, float]) -> float | None:
    """A judgement's score in 0..1 by the named parser; None when it cannot be read."""
    if parser == "verdict":
        return verdict(text, yes, no)
    if parser == "number":
        found = NUMBER.findall(text)
        return on_scale(found[-1] if found else None, scale)
    if parser == "boxed":
        found = BOXED.findall(text)
        return on_scale(found[-1].strip() if found else None, scale)
    return on_scale(json_score(text), scale)


def verdict(text: str, yes: list[str], no: list[str]) -> float | None:
    """1 for the last verdict word of the text that is a yes word, 0 for a no word (case ignored)."""
    yes_set, no_set = {w.lower() for w in yes}, {w.lower() for w in no}
    for word in reversed(WORD.findall(text.lower())):
        if word in yes_set:
            return 1.0
        if word in no_set:
            return 0.0
    return None


def json_score(text: str):
    """The "score" of the first JSON object in the text that has one."""
    decoder, at = json.JSONDecoder(), text.find("{")
    while at != -1:
        try:
            value, _ = decoder.raw_decode(text, at)
        except ValueError:
            value = None
        if isinstance(value, dict) and "score" in value:
            return value["score"]
        at = text.find("{", at + 1)
    return None


def on_scale(value, scale: tuple[float, float]) -> float | None:
    """A number on the judge's scale as 0..1; None if it is not a finite number within the scale."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    lo, hi = scale
    if not math.isfinite(x) or not lo <= x <= hi:
        return None
    return (x - lo) / (hi - lo)
