"""A step's samples: generated and scored (samples) in one call, in chunks, or as multi-turn episodes
(multi_turn), now or ahead of the step (pipeline), and what a step samples and pushes weights through
(rollouts); episodes of an agent program behind an OpenAI-compatible endpoint (agents), DAPO's dynamic
sampling (dynamic) and partial rollouts, unfinished samples carried into the next step (partial)."""
