"""The standalone gateway's engine: a call's prompt to a rollout service over gRPC, with the caller's own
sampling settings (temperature, top_p, seed, stop, n), each session kept on one replica (its prefix is
there) and sessions spread over the replicas by how many each holds. A replica that fails is set aside
and the call goes to the next one; the last one's failure is the caller's 503."""

import itertools
import logging
import threading

import torch

from meshrl.codec.payload import Payload
from meshrl.dataproto import DataProto
from meshrl.errors import ServiceError
from meshrl.gateway.protocol import Request
from meshrl.gateway.sessions import Session
from meshrl.rpc import Client
from meshrl.v1 import common_pb2, rollout_pb2

log = logging.getLogger(__name__)
SERVICE = rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"]


class RolloutEngine:
    def __init__(self, addresses: list[str], timeout: float = 600.0):
        self.clients = {a: Client(a, SERVICE, timeout=timeout) for a in addresses}
        self.held = dict.fromkeys(addresses, 0)  # sessions on each replica
        self.down: set[str] = set()
        self.seeds = itertools.count(1)
        self.lock = threading.Lock()

    def max_model_len(self) -> int:
        """The context the replicas take (the least of theirs), from their Describe."""
        lengths = []
        for address, client in self.clients.items():
            info = client.call("Describe", timeout=30)
            assert isinstance(info, common_pb2.ServiceInfo)
            if "max_model_len" not in info.details:
                raise ValueError(f"the rollout at {address} does not say its max_model_len: give --max-model-len")
            lengths.append(int(info.details["max_model_len"]))
        return min(lengths)

    def _replica(self, session: Session) -> str:
        with self.lock:
            if session.replica is None or session.replica in self.down:
                if session.replica is not None:
                    self.held[session.replica] -= 1
                live = [a for a in self.clients if a not in self.down] or list(self.clients)
                session.replica = min(live, key=lambda a: self.held[a])
                self.held[session.replica] += 1
            return session.replica

    def generate(self, session: Session, ids: list[int], n: int, max_new: int, request: Request) -> list:
        sampling = rollout_pb2.SamplingParams(
            n=n,
            greedy=request.temperature == 0,
            temperature=1.0 if request.temperature is None else request.temperature,
            top_p=1.0 if request.top_p is None else request.top_p,
            top_k=-1,
            max_new_tokens=max_new,
            logprobs=request.temperature != 0,
            seed=request.seed if request.seed is not None else next(self.seeds),
            stop=request.stop,
        )
        prompt = DataProto(
            {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)}
        )
        for _ in range(len(self.clients)):
            name = self._replica(session)
            try:
                _, gen = self.clients[name].call_batch(
                    "Generate",
                    Payload(rollout_pb2.GenerateRequest(sampling=sampling), prompt),
                    rollout_pb2.GenerateResponse,
                )
                break
            except ServiceError as e:
                if e.code.name not in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
                    raise
                log.warning("rollout replica %s failed (%s); its sessions go to another replica", name, e.code.name)
                with self.lock:
                    self.down.add(name)
                    if len(self.down) == len(self.clients):
                        self.down.clear()  # all failed once: try them all again next time
                        raise
        version = int(gen.meta_info.get("weight_version", 0))
        out = []
        for i in range(len(gen)):
            k = int(gen.batch["response_mask"][i].sum())
            logprobs = gen.batch["rollout_logprobs"][i, :k].tolist() if "rollout_logprobs" in gen.batch else [0.0] * k
            out.append(
                (gen.batch["responses"][i, :k].tolist(), logprobs, gen.non_tensor_batch["response_text"][i], version)
            )
        return out

    def close(self) -> None:
        for c in self.clients.values():
            c.close()
