"""The environment service: Python environments (one object per episode) behind EnvService.

- servicer: the EnvService over Python environments (reset, step, close, Describe's stop strings and tools).
- pool: the worker processes the environment objects live in, each episode pinned to one, stopped on overrun.
- worker: a worker process: loads the environment class and runs its episodes' calls, each on its own thread.
- episodes: one worker's environment objects by episode id, and the checks on what they return.
- calculator: the bundled tool environment, a calculator for arithmetic problems.
- code_tools: python and bash tools run in the sandbox service, files kept for the episode.
- main: `meshrl serve env`, until SIGTERM.
"""
