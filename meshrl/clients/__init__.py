"""Typed clients for the services, as the orchestrator uses them: they check what comes back.

A remote service may be any server that speaks the proto (ours, or one in
another language), so replies are validated here, with errors naming the sample.

- reward: RewardClient, a batch scored on any RewardService server and the reply checked.
- sandbox: the sandbox service MESHRL_SANDBOX names, for code that runs programs in it.
"""

from meshrl.clients.reward import RewardClient, Scores

__all__ = ["RewardClient", "Scores"]
