"""Rows for the tests of the actor's padding-free passes (tests/unit/test_packing*.py, test_head.py): a
small model's size, random rows of given prompt and response lengths in verl's layout, and three GRPO
groups whose rows share their prompts."""

import torch

from meshrl.layout import rollout_tensors

SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2}


def batch(prompts: list[int], responses: list[int], vocab: int, seed: int = 0) -> dict:
    """verl's layout (meshrl.layout.rollout_tensors: left-padded prompts, right-padded responses)."""
    g = torch.Generator().manual_seed(seed)
    draw = lambda n: torch.randint(3, vocab, (n,), generator=g).tolist()  # noqa: E731
    return rollout_tensors([draw(p) for p in prompts], [draw(r) for r in responses], 0)


def grouped(vocab: int) -> dict:
    """Three GRPO groups (prompts of 6, 9 and 4 tokens, 2-3 samples each), responses of every length."""
    mb = batch([6, 6, 9, 9, 9, 4, 4, 4], [4, 2, 5, 1, 7, 3, 6, 2], vocab)
    width = mb["input_ids"].shape[1] - mb["responses"].shape[1]
    for rows in ([0, 1], [2, 3, 4], [5, 6, 7]):
        mb["input_ids"][rows, :width] = mb["input_ids"][rows[0], :width]
    return mb
