"""What bench/peer_trl.py and bench/peer_bare.py share: the task's data and reward rule, and greedy
held-out accuracy. Imports only torch, transformers and pandas, so it runs in TRL's venv and in meshrl's."""

import argparse

import pandas as pd
import torch
from transformers import BatchEncoding


def correct(text: str, truth) -> bool:
    """The arithmetic scorer's rule: the answer's first line, as an integer, equals the ground truth."""
    first = text.strip().split("\n", 1)[0].strip()
    return first.lstrip("-").isdigit() and int(first) == int(str(truth).strip())


def rows(path) -> list[dict]:
    df = pd.read_parquet(path)
    return [
        {"prompt": [dict(m) for m in p], "ground_truth": str(r["ground_truth"])}
        for p, r in zip(df["prompt"], df["reward_model"])
    ]


def encode(tok, batch: list[dict]) -> BatchEncoding:
    """Chat-rendered prompts, left padded."""
    texts = [tok.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True) for r in batch]
    tok.padding_side = "left"
    return tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)


def accuracy(model, tok, test: list[dict], max_new_tokens: int = 8) -> float:
    enc = encode(tok, test).to(model.device)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tok.pad_token_id)
    model.train(was_training)
    answers = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    return sum(correct(a, r["ground_truth"]) for a, r in zip(answers, test)) / len(test)


def arguments() -> argparse.Namespace:
    """The peers' command line: MODEL TRAIN.parquet TEST.parquet STEPS OUT.json [--val-every 20]
    [--optimizer-steps 1] [--lr 1e-4] [--prompts 32] [--samples 8] [--max-new-tokens 8] [--seed 0]."""
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("train")
    ap.add_argument("test")
    ap.add_argument("steps", type=int)
    ap.add_argument("out")
    ap.add_argument("--val-every", type=int, default=20)
    ap.add_argument("--device", default="cpu", help="the bare loop's device (cpu, cuda)")
    ap.add_argument(
        "--optimizer-steps", type=int, default=1, help="optimizer steps per batch (mini-batches of 256/K rows)"
    )
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--prompts", type=int, default=32, help="prompts per batch")
    ap.add_argument("--samples", type=int, default=8, help="samples per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0, help="the data's order and the sampling")
    return ap.parse_args()
