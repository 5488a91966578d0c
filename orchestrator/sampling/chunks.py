"""rollout.chunks=C > 1: a step's prompts go to the rollout as C concurrent Generate calls, each prompt's
group of samples whole in one call, and each call's samples are scored as soon as it returns, so scoring
overlaps the generation still running (vLLM runs the calls in the same engine steps; the HF backend takes
them in turn). Prompt i of the step samples with seed + i whichever call carries it, and from random
streams of its own on both backends, so it samples what it would in one call. With a rollout fleet each
call goes to the replica with the fewest samples in flight (lifecycle.fleet); the replies are joined into
one batch (lifecycle.fleet.join_generations). timing_s/gen is until the last call returns,
timing_s/reward what scoring took after it.
"""

from __future__ import annotations

import concurrent.futures
import time

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
        Scores.join([scores[i] for i in order], gen.batch["responses"].shape[1]),
        {"timing_s/gen": generated - start, "timing_s/reward": time.perf_counter() - generated},
    )
