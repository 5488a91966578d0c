"""rollout.chunks=C > 1: a step's prompts go to the rollout as C concurrent Generate calls, each prompt's
group of samples whole in one call, and each call's samples are scored as soon as it returns, so scoring
overlaps the generation still running. vLLM runs the calls in the same engine steps (continuous
batching), so the generation takes as long as one call; the HF backend takes them in turn.

Prompt i of the step samples with seed + i whichever call carries it, and from random streams of its
own on both backends, so it samples what it would in one call. With a rollout fleet each call goes to
the replica with the fewest samples in flight (lifecycle.fleet). The calls' replies
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
from orchestrator.lifecycle.fleet import join_generations, starts
from orchestrator.sampling.sampled import Sampled, per_prompt


def sample(
    mesh, prompts: DataProto, seed: int, tokenizer=None, *, n=None, greedy=False, judged=True, on_generated=None
) -> Sampled:
    """`prompts` in rollout.chunks concurrent calls (sampling.sampled's form)."""
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
            # each to the least loaded replica, all picked in order before any is sent (no call has ended)
            picked = [mesh.router.pick(len(part) * per_prompt(mesh.cfg, n, greedy)) for _, part in parts]
            pending = {
                generating.submit(
                    mesh.generate, part, seed=seed + a, n=n, greedy=greedy, colocated=False, replica=replica
                ): i
                for i, ((a, part), replica) in enumerate(zip(parts, picked))
            }
            scored = {}
            for done in concurrent.futures.as_completed(pending):
                i = pending[done]
                gens[i] = done.result()
                scored[scoring.submit(mesh.score, gens[i], judged=judged)] = i
        generated = time.perf_counter()
        if on_generated is not None:
            on_generated()
        for done in concurrent.futures.as_completed(scored):
            scores[scored[done]] = done.result()
    order = range(len(parts))
    gen = join_generations([gens[i] for i in order])
    return Sampled(
        gen,
        join_scores([scores[i] for i in order], gen.batch["responses"].shape[1]),
        {"timing_s/gen": generated - start, "timing_s/reward": time.perf_counter() - generated},
    )


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
