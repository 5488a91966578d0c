"""A generative judge grading a step's samples beside the reward service (docs/training.md, "A judge").

- settings: the run's judge.* keys (JudgeSection).
- programs: what the judge is asked (rubric templates, pointwise and pairwise) and how its answer is read
  (the named parsers).
- client: asking it, through a cache: a rollout service of the mesh in one Generate, or an
  OpenAI-compatible server.
- grading: a batch's judge scores, retried or settled when unreadable, joined with the reward service's.
"""
