"""A step's samples. How a batch is sampled, one form for every way (sampled: what they give back, and one
Generate call; chunks: concurrent calls; multi_turn: the environment service's episodes; agents: an
agent's, behind an OpenAI-compatible endpoint; episodes: what the two episode samplers share), picked in
one place (samples, with what samples are read as); when a step samples (rollouts: the StepSampler
protocol, now or ahead of the step with pipeline's producer; partial: rounds that carry unfinished samples;
dynamic: DAPO's dynamic sampling); and what of these cannot be combined (combinations)."""
