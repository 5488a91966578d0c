"""A step's samples: generated and scored (samples) in one call, in chunks, or as multi-turn episodes, now
or ahead of the step (pipeline), and what a step samples and pushes weights through (rollouts)."""
