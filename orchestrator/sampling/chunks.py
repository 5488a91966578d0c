"""rollout.chunks=C > 1: a step's prompts go to the rollout as C concurrent Generate calls, each prompt's
group of samples whole in one call, and each call's samples are scored as soon as it returns, so scoring
overlaps the generation still running. vLLM runs the calls in the same engine steps (continuous
batching), so the generation takes as long as one call; the HF backend takes them in turn.

Prompt i of the step samples with seed + i whichever call carries it, as in one call. The calls' replies
are joined into one batch in verl's layout: prompts left padded and responses right padded to the
widest call's. timing_s/gen is until the last call returns, timing_s/reward what scoring took after it.
"""

from __future__ import annotations

import concurrent.futures
import time

import numpy as np
import torch
import torch.nn.functional as F

from meshrl.clients.reward import Scores
from meshrl.dataproto import DataProto

RESPONSE_WIDE = ("rollout_logprobs", "response_mask")  # (B, T) tensors besides responses: right padded


def starts(rows: int, chunks: int) -> list[int]:
    """Where each of (at most) `chunks` near-equal consecutive parts of `rows` prompts begins."""
    chunks = max(1, min(chunks, rows))
    return [i * rows // chunks for i in range(chunks)]


def sample(mesh, prompts: DataProto, seed: int, on_generated=None) -> tuple:
    """(gen, scored, {"gen": s, "reward": s}) for `prompts` in rollout.chunks concurrent calls."""
    bounds = [*starts(len(prompts), mesh.cfg.rollout.chunks), len(prompts)]
    parts = [(a, prompts.slice(a, b)) for a, b in zip(bounds, bounds[1:])]
    gens: dict[int, DataProto] = {}  # by part
    scores: dict[int, Scores] = {}
    start = time.perf_counter()
    with (
        concurrent.futures.ThreadPoolExecutor(len(parts), thread_name_prefix="meshrl-chunk") as generating,
        concurrent.futures.ThreadPoolExecutor(len(parts), thread_name_prefix="meshrl-score") as scoring,
    ):
        with mesh.colocated_generation():
            pending = {
                generating.submit(mesh.generate, part, seed=seed + a, colocated=False): i
                for i, (a, part) in enumerate(parts)
            }
            scored = {}
            for done in concurrent.futures.as_completed(pending):
                i = pending[done]
                gens[i] = done.result()
                scored[scoring.submit(mesh.score, gens[i])] = i
        generated = time.perf_counter()
        if on_generated is not None:
            on_generated()
        for done in concurrent.futures.as_completed(scored):
            scores[scored[done]] = done.result()
    order = range(len(parts))
    gen = join_generations([gens[i] for i in order])
    return (
        gen,
        join_scores([scores[i] for i in order], gen.batch["responses"].shape[1]),
        {"gen": generated - start, "reward": time.perf_counter() - generated},
    )


def join_generations(parts: list[DataProto]) -> DataProto:
    """Generate replies of consecutive prompts as one: prompts left padded, responses right padded to the
    widest, and the oldest weight version of the parts."""
    if len(parts) == 1:
        return parts[0]
    P = max(p.batch["prompts"].shape[1] for p in parts)
    T = max(p.batch["responses"].shape[1] for p in parts)
    version = min(q.meta_info.get("weight_version", 0) for q in parts)
    padded = []
    for p in parts:
        b, pad = p.batch, p.meta_info.get("pad_token_id", 0)
        left, right = P - b["prompts"].shape[1], T - b["responses"].shape[1]
        width = b["prompts"].shape[1]
        prompts = F.pad(b["prompts"], (left, 0), value=pad)
        responses = F.pad(b["responses"], (0, right), value=pad)
        mask = torch.cat(
            [F.pad(b["attention_mask"][:, :width], (left, 0)), F.pad(b["attention_mask"][:, width:], (0, right))], 1
        )
        tensors = {
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], 1),
            "attention_mask": mask,
            "position_ids": (mask.cumsum(1) - 1).clamp(min=0),
            **{k: F.pad(b[k], (0, right)) for k in RESPONSE_WIDE if k in b},
        }
        unknown = set(b) - set(tensors)
        if unknown:
            raise ValueError(f"the rollout replied with tensors {sorted(unknown)} that chunks cannot join")
        padded.append(DataProto(tensors, p.non_tensor_batch, {**p.meta_info, "weight_version": version}))
    return DataProto.concat(padded)


def join_scores(parts: list[Scores], width: int) -> Scores:
    """Scores of consecutive samples as one. Batch metrics: counts (reward/num_*) add up, the others are
    averaged with each part's samples as weights; a column some parts lack is None in their rows."""
    if len(parts) == 1:
        return parts[0]
    sizes = [len(s.scores) for s in parts]
    token_level = None
    levels = [s.token_level_scores for s in parts if s.token_level_scores is not None]
    if len(levels) == len(parts):
        token_level = torch.cat([F.pad(t, (0, width - t.shape[1])) for t in levels])
    names = dict.fromkeys(k for s in parts for k in s.columns)
    columns = {
        k: np.concatenate(
            [s.columns[k] if k in s.columns else np.full(n, None, dtype=object) for s, n in zip(parts, sizes)]
        )
        for k in names
    }
    metrics = {}
    for k in dict.fromkeys(k for s in parts for k in s.metrics):
        have = [(s.metrics[k], n) for s, n in zip(parts, sizes) if k in s.metrics]
        metrics[k] = (
            sum(v for v, _ in have)
            if k.startswith("reward/num_")
            else sum(v * n for v, n in have) / sum(n for _, n in have)
        )
    return Scores(torch.cat([s.scores for s in parts]), token_level, columns, metrics)
