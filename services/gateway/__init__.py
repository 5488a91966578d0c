"""The OpenAI-compatible endpoint as a service of its own (`meshrl serve gateway`).

The endpoint itself is meshrl/gateway, shared with a training run's agents.

- engine: a call's prompt to a rollout service over gRPC, each session kept on one replica, failures retried
  on the next.
- main: `meshrl serve gateway`, the endpoint in front of running rollout services, with its API keys.
"""
