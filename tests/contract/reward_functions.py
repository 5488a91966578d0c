"""Reward functions for the reward-service tests: well-behaved, misbehaving, batched, and of TRL's form.

The response text selects the behaviour: "hang" sleeps past any timeout, "die"
kills the worker process, "nan" / "str" return bad values, "raise" raises.
"""

import os
import time


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "hang":
        time.sleep(600)
    if solution_str == "die":
        os._exit(3)
    if solution_str == "nan":
        return float("nan")
    if solution_str == "str":
        return "high"
    if solution_str == "raise":
        raise ZeroDivisionError("division by zero")
    print("printing from a reward function must not break the worker")
    return {"score": float(solution_str.strip() == str(ground_truth)), "length": len(solution_str)}


def compute_score_batched(data_sources, solution_strs, ground_truths, extra_infos):
    return [float(s == g) for s, g in zip(solution_strs, ground_truths)]


def compute_score_batched_short(data_sources, solution_strs, ground_truths, extra_infos):
    return [1.0] * (len(solution_strs) - 1)


def compute_score_batched_reordered(solution_strs, ground_truths, data_sources=None, extra_infos=None, **kwargs):
    """verl passes its lists by keyword: the order in the signature must not matter."""
    return [float(s == g) for s, g in zip(solution_strs, ground_truths)]


def compute_score_keyword_only(*, ground_truth, solution_str, **kwargs):
    return float(solution_str.strip() == str(ground_truth))


def accuracy_reward(completions, solution, **kwargs):
    """TRL's form (trl.rewards.accuracy_reward's signature): completions as messages for chat prompts, text
    otherwise; a dataset column by name; None for a sample it cannot score."""
    out = []
    for completion, answer in zip(completions, solution):
        text = completion[0]["content"] if isinstance(completion, list) else completion
        out.append(None if text == "skip" else float(text.strip() == answer))
    return out


def trl_echo(prompts, completions, **kwargs):
    """TRL's form: scores 1 where the call looked as TRL makes it (chat completions for chat prompts, the
    dataset's columns as lists, no reserved name among them)."""
    chat = [isinstance(p, list) for p in prompts]
    shapes = [isinstance(c, list) and c[0]["role"] == "assistant" for c in completions]
    ok = chat == shapes and all(len(v) == len(prompts) for v in kwargs.values()) and "prompt" not in kwargs
    return [float(ok)] * len(prompts)
