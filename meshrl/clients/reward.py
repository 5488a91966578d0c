"""RewardClient: score a batch on any RewardService server and check the reply."""

import dataclasses
from typing import Any

import numpy as np
import torch

from meshrl.algos import masked
from meshrl.codec import Payload
from meshrl.dataproto import DataProto
from meshrl.rpc import Client
from meshrl.v1 import common_pb2, reward_pb2

SERVICE = reward_pb2.DESCRIPTOR.services_by_name["RewardService"]


@dataclasses.dataclass
class Scores:
    scores: torch.Tensor  # (N,) float32
    token_level_scores: torch.Tensor | None  # (N, T) when the request had a response_mask (made from
    #   scores, on each row's last response token, when the server sends none)
    columns: dict[str, np.ndarray]  # per-sample extras: acc, format_ok, reward_status, ...
    metrics: dict[str, float]  # the server's batch metrics: reward/num_failed, reward/<extra>/mean, ...


class RewardClient:
    def __init__(self, address: str, token: str | None = None, timeout: float = 600.0, client: Client | None = None):
        """`client`: an existing Client of the service to use (its channel, retries and deadline)."""
        self.address = address
        self.client = client or Client(address, SERVICE, token=token, timeout=timeout)

    def wait_ready(self, timeout: float = 60.0) -> None:
        self.client.wait_ready(timeout)

    def describe(self) -> common_pb2.ServiceInfo:
        return self.client.describe()

    def score(self, batch: DataProto) -> Scores:
        # plain tensors: a reward server may be written in any language against data.proto's `tensors`
        request = Payload(reward_pb2.ScoreRequest(), batch, packed=False)
        reply, scored = self.client.call_batch("Score", request, reward_pb2.ScoreResponse)
        return check_reply(self.address, batch, scored, dict(reply.metrics))

    def close(self) -> None:
        self.client.close()


def check_reply(address: str, batch: DataProto, data: DataProto, metrics: dict[str, Any]) -> Scores:
    n = len(batch)
    where = f"reward service at {address}"
    if "scores" not in data.batch:
        raise ValueError(f"{where} returned no 'scores' tensor")
    scores = data.batch["scores"]
    if scores.dim() != 1 or scores.shape[0] != n:
        raise ValueError(f"{where} returned {list(scores.shape)} scores for {n} samples")
    scores = scores.float()
    bad = torch.nonzero(~torch.isfinite(scores)).flatten()
    if len(bad):
        raise ValueError(
            f"{where} returned {scores[bad[0]].item()} for sample {bad[0].item()} ({len(bad)} non-finite scores)"
        )
    token_level = data.batch.get("token_level_scores")
    mask = batch.batch.get("response_mask")
    if token_level is not None and mask is not None and token_level.shape != mask.shape:
        raise ValueError(
            f"{where} returned token_level_scores of shape {list(token_level.shape)}, "
            f"the responses are {list(mask.shape)}"
        )
    if token_level is None and mask is not None:  # optional in the contract: each score on the last token
        token_level = masked.token_level(scores, mask)
    columns = dict(data.non_tensor_batch)
    if "reward/num_failed" not in metrics and "reward_status" in columns:  # a server that sends only columns
        metrics["reward/num_failed"] = float(sum(s != "ok" for s in columns["reward_status"]))
    return Scores(scores, token_level, columns, metrics)
