"""The actor service as a process of its own (`meshrl serve actor`, its ranks under it) and what the
contract tests send it: a small batch in verl's layout and the log-probs HF gives for it. The fixtures
built from these are in conftest.py."""

import subprocess
import sys
import tempfile

import torch
from transformers import AutoModelForCausalLM

from meshrl.codec import Payload
from meshrl.codec.values import to_value
from meshrl.dataproto import DataProto
from meshrl.rpc import Client
from meshrl.v1 import actor_pb2

SERVICE = actor_pb2.DESCRIPTOR.services_by_name["ActorService"]
P, T = 5, 6


class Service:
    def __init__(self, *args: str, root: str = tempfile.gettempdir()):  # pytest's tmp_path lies under it
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cli", "serve", "actor", "--checkpoint-root", root, *args],
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline()
        assert "listening on" in line, line
        self.client = Client(line.split()[-1], SERVICE, timeout=300)

    def call(self, method, msg=None, data=None):
        return self.client.call(method, Payload(msg, data) if data is not None else msg)

    def logprobs(self, data, key="actor_logprobs"):
        return self.call("ComputeLogProbs", actor_pb2.BatchRequest(), data).data.batch[key]

    def update(self, step, loss, data, **params):
        spec = actor_pb2.LossSpec(name=loss, params={k: to_value(v, k) for k, v in params.items()})
        return self.call("Update", actor_pb2.UpdateRequest(step=step, loss=spec), data)

    def stop(self):
        self.proc.terminate()
        assert self.proc.wait(60) == 0


def batch(rows=4, seed=0) -> DataProto:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, 100, (rows, P + T), generator=g)
    mask = torch.ones(rows, P + T, dtype=torch.long)
    mask[0, :2] = 0
    response_mask = torch.ones(rows, T)
    response_mask[-1, 3:] = 0
    return DataProto(
        {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": (mask.cumsum(1) - 1).clamp(min=0),
            "responses": ids[:, P:],
            "response_mask": response_mask,
        }
    )


def hf_logprobs(model_dir, data: DataProto) -> torch.Tensor:
    return hf_logprobs_of(AutoModelForCausalLM.from_pretrained(model_dir), data)


def hf_logprobs_of(model, data: DataProto) -> torch.Tensor:
    b = data.batch
    with torch.no_grad():
        logits = model(
            input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]
        ).logits[:, -T - 1 : -1]
    return torch.log_softmax(logits, -1).gather(-1, b["responses"].unsqueeze(-1)).squeeze(-1)


def next_step(service) -> int:
    return int(service.call("Describe").details["last_step"]) + 1


def seq_logprob(lp, data):
    return (lp * data.batch["response_mask"]).sum(-1)
