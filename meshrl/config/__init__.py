"""Each service's typed settings and the update losses' parameters, on the shared floor: defined, documented
and checked once (meshrl/config/checked.py), and read by both sides.

- actor: EngineSettings + seed = EngineConfig; OptimSettings + betas, total_steps = OptimConfig
- rollout: RolloutSettings + model, seed = RolloutConfig
- reward: RewardConfig
- env: EnvSettings + the service's own limits = EnvConfig
- sandbox: SandboxConfig (the sandbox service's limits and ceilings)
- losses: PPOParams (Schedule, PolicyLossSettings, RolloutISSettings), DPOParams, SFTParams, ValueParams

A service parses its flags into its Config class (meshrl.flags). The run config's sections are made of
the *Settings classes (orchestrator/config.py), and the run derives the flags it starts a service with,
what a service given by address must report, and the loss parameters it sends, from the same classes
(orchestrator/lifecycle/mesh.py::settings, orchestrator/loops/params.py). The fields a Config adds to its Settings are
what a run fills in from other sections, or the service's own.
"""
