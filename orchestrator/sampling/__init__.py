"""A step's samples: generated and scored, in one call, in chunks, as multi-turn episodes, or ahead."""
