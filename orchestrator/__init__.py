"""Orchestrator: the stateless algorithm loops (PPO, GRPO, RLOO, REINFORCE++, online DPO, SFT).

Its rooms, each importing only the ones listed before it (tests/unit/test_import_rule.py checks it):

- judge/: a generative judge's settings, programs and calls (its settings are a section of config).
- config, verl_keys: the run's typed YAML config with dotted overrides; data: verl parquet to prompt
  batches, a seeded resumable sampler; timer: the step's phase clock (timing_s/<phase>).
- lifecycle/: the services a run uses: start them or reach given ones (services), the calls on them
  (mesh), the checks before and at the start (preflight, agreement).
- agents/: agents written against the OpenAI API, played as episodes (sampling/agents drives them).
- sampling/: a step's samples: one call or chunks, multi-turn episodes, ahead of the step (pipeline), and
  what a step samples and pushes weights through (rollouts).
- loops/: the step contract (algorithm), one step per algorithm (policy_gradient, dpo, sft), and the loss
  parameters each update sends (params).
- output/: what a run leaves: logs as it goes (loggers), curves and summary at the end (report).
- run/: the loop every algorithm shares (trainer), the run's state (state), validation, checkpoints and
  recovery.
- main, ray_launch: `meshrl ALGORITHM ...` with local services, `meshrl ray ALGORITHM ...` on Ray.
- `meshrl config from-verl` (they import config and verl_keys only): a shell script read as bash would run
  it, nothing run (shell_syntax: parsing; shell_words: variables and expansions; shell: running up to a
  command sought), a verl launch script's verl command read from it (verl_script), verl's defaults
  (verl_defaults) and its keys mapped to ours (from_verl).

The orchestrator talks to services only through gRPC clients (meshrl.clients, meshrl.rpc).
"""
