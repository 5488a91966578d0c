"""A step's samples. How a batch is sampled, one form for every way (sampled: what they give back, one
Generate call, the seeds; chunks: concurrent calls; multi_turn: the environment service's episodes; agents:
an agent's, behind an OpenAI-compatible endpoint; episodes: what the two episode samplers share); when a
step samples (rollouts: the StepSampler protocol, the one dispatch of how, and Now; pipeline: Ahead, with
its producer; partial: rounds that carry unfinished samples; dynamic: DAPO's dynamic sampling); and what of
these cannot be combined (combinations)."""
