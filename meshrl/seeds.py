"""Every seed stream a run draws from, named once: how a stream's seed is made from trainer.seed (and the
step, epoch, round, episode or call it belongs to). Streams are kept apart by multiplying by primes larger
than any count they are added to, so two of them never share a seed in practice; changing a value here
changes every seeded result of a run (the main job's figures were measured with these)."""

STEP = 1_000_003  # step s samples with trainer.seed * STEP + s (the rollout's seeds; the actor's clip-cov picks)
ROUND = 7919  # a step's further sampling rounds (algorithm.dynamic_sampling): + ROUND * round
EPOCH = 100_003  # the data's order in epoch e: trainer.seed * EPOCH + e
EPISODE = 100_003  # multi-turn episode i of a step: the step's seed * EPISODE + i
BATCHER = 7919  # a step's k-th batcher of turns (a replica, a stop list): the step's seed + BATCHER * k
CALL = 1009  # a batcher's c-th Generate: its seed * CALL + c * spacing
AGENT_CALL_SPACING = 1 << 16  # an agent run's calls' seeds this far apart (row i of a call samples with seed + i)


def step_seed(seed: int, number: int, round: int = 0) -> int:
    """The seed step `number` (its sampling round `round`) samples with."""
    return seed * STEP + number + ROUND * round
