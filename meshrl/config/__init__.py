"""Each service's typed settings, on the shared floor: the services parse their flags into them (meshrl.flags),
and the orchestrator derives the flags it starts a service with, and what a service given by address must
report, from the same classes (orchestrator/mesh.py::settings). One definition per setting.

- actor: EngineConfig (how the engine holds the model) and OptimConfig (how it optimizes)
- rollout: RolloutConfig
- reward: RewardConfig
- env: EnvConfig
"""
