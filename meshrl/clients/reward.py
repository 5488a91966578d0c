"""RewardClient: score a batch on any RewardService server and check the reply."""

import dataclasses
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

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

    def select(self, rows: list[int]) -> "Scores":
        """The scores of `rows`, in that order (the batch metrics as they were)."""
        idx = torch.tensor(rows, dtype=torch.long)
        token_level = self.token_level_scores[idx] if self.token_level_scores is not None else None
        columns = {k: np.asarray(v, dtype=object)[rows] for k, v in self.columns.items()}
        return Scores(self.scores[idx], token_level, columns, dict(self.metrics))

    @staticmethod
    def join(parts: list["Scores"], width: int) -> "Scores":
        """Scores of consecutive samples as one, token-level scores padded to `width`. Batch metrics: counts
        (reward/num_*) add up, the others are averaged with each part's samples as weights; a column some
        parts lack is None in their rows."""
        if len(parts) == 1:
            return parts[0]
        sizes = [len(s.scores) for s in parts]
        levels = [s.token_level_scores for s in parts if s.token_level_scores is not None]
        token_level = None
        if len(levels) == len(parts):
            token_level = torch.cat([F.pad(t, (0, width - t.shape[1])) for t in levels])
        names = dict.fromkeys(k for s in parts for k in s.columns)
        missing = lambda n: np.full(n, None, dtype=object)  # noqa: E731
        columns = {k: np.concatenate([s.columns.get(k, missing(n)) for s, n in zip(parts, sizes)]) for k in names}
        metrics = {}
        for k in dict.fromkeys(k for s in parts for k in s.metrics):
            have = [(s.metrics[k], n) for s, n in zip(parts, sizes) if k in s.metrics]
            counted = k.startswith("reward/num_")
            metrics[k] = sum(v for v, _ in have) if counted else sum(v * n for v, n in have) / sum(n for _, n in have)
        return Scores(torch.cat([s.scores for s in parts]), token_level, columns, metrics)


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
