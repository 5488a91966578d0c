"""meshrl services: one package per role (actor, rollout, reward, env), each a gRPC server.

Services import the shared `meshrl` package and never each other; they meet only
through the protos in protos/meshrl/v1.
"""
