"""The RewardService: decode the request, score, encode the reply. Nothing else lives here."""

import os

from meshrl.clients.sandbox import VAR as SANDBOX_VAR
from meshrl.codec import Payload
from meshrl.config.reward import RewardConfig
from meshrl.errors import InvalidArgument
from meshrl.flags import settings_json
from meshrl.lifeline import serve_child
from meshrl.v1 import common_pb2, reward_pb2
from services.reward.samples import build_reply, read_samples
from services.reward.scoring import make_scorer


class RewardServicer:
    SERVICE = reward_pb2.DESCRIPTOR.services_by_name["RewardService"]

    def __init__(self, cfg: RewardConfig):
        self.cfg = cfg
        self.sandbox = None  # a sandbox service of its own (--sandbox auto), stopped with this one
        if cfg.sandbox == "auto":
            self.sandbox, address = serve_child(["sandbox"])
        if cfg.sandbox:  # before the workers start: they inherit it (services/reward/scorers/code.py)
            os.environ[SANDBOX_VAR] = address if self.sandbox is not None else cfg.sandbox
        self.scorer = make_scorer(cfg)

    def Describe(self, request, context) -> common_pb2.ServiceInfo:
        cfg = self.cfg
        return common_pb2.ServiceInfo(
            service="reward",
            backend=cfg.backend,
            model=cfg.model or cfg.url or cfg.function or "builtin",
            details={
                "workers": str(cfg.workers),
                "timeout": str(cfg.timeout),
                "on_error": cfg.on_error,
                "settings": settings_json(cfg),
            },
        )

    def Score(self, request: Payload, context) -> Payload:
        if request.data is None:
            raise InvalidArgument("ScoreRequest.data is missing")
        samples = read_samples(request.data)
        outcomes = self.scorer.score(samples)
        data, metrics = build_reply(
            request.data, samples, outcomes, self.cfg.on_error, self.cfg.error_score, self.scorer.none_ok
        )
        return Payload(reward_pb2.ScoreResponse(metrics=metrics), data)

    def close(self):
        self.scorer.close()
        if self.sandbox is not None:
            self.sandbox.terminate()
            self.sandbox.wait()
