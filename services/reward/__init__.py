"""Reward service: rule-based scorers, user functions, reward models, a remote server; `meshrl serve reward`.

- its settings: RewardConfig in meshrl/config, shared with the run.
- servicer: the RewardService gRPC methods (thin).
- samples: request rows -> Samples, Outcomes -> the reply batch.
- scoring: FunctionScorer (built-in or user function, in the worker pool) and ModelScorer.
- remote: UrlScorer, an OpenRLHF-style reward server over HTTP (reward.url).
- functions: load a function by spec, check what it returns.
- pool / worker: the isolated worker processes (meshrl.pipes: how they are started and talk).
- scorers/: the built-in rule scorers, by data_source.
- main: `meshrl serve reward`, until SIGTERM.
"""
