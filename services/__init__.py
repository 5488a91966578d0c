"""meshrl services: one package per role (actor, rollout, reward, env, sandbox), each a gRPC server, and
gateway, the OpenAI-compatible endpoint as a service of its own (`meshrl serve gateway`).

Services import the shared `meshrl` package and never each other; they meet only
through the protos in protos/meshrl/v1.
"""
