"""The services one run talks to, and the calls the loops make on them, each a gRPC call.

    mesh = start_mesh(cfg, services, roles={"actor", "rollout", "reward", "ref"})
    gen = mesh.generate(prompts, seed=...)          # rollout
    scored = mesh.score(gen)                        # reward
    gen.batch["ref_logprobs"] = mesh.logprobs("ref", gen)
    metrics = mesh.update("actor", step, "ppo", params, batch)
    mesh.push_weights(version=step)                 # actor -> rollout

A role without an address in the config is started here as a local process;
one with an address is used as it is (after a health check naming it).
A Mesh is the services and the calls on them, nothing of the run's own state:
steps, data and the producer sampling ahead are the run loop's (run.state).
"""

import concurrent.futures
import contextlib
import dataclasses
import json
import logging
import time
from typing import Any

import grpc
import torch

from meshrl import modalities
from meshrl.chat import prompt_text
from meshrl.clients import RewardClient
from meshrl.codec import Payload
from meshrl.codec.values import to_value
from meshrl.config.losses import PARAMS, ROUTED, update_inputs
from meshrl.dataproto import DataProto
from meshrl.errors import ServiceError
from meshrl.rpc import Client
from meshrl.typed import build
from meshrl.v1 import actor_pb2, rollout_pb2
from orchestrator.config import Config
from orchestrator.judge.grading import Judge
from orchestrator.lifecycle.fleet import (
    NoReplica,
    Router,
    is_replica,
    join_generations,
    starts,
)
from orchestrator.lifecycle.roles import FROZEN, MODELS, absolute, delta_push, ref_in_actor, wanted
from orchestrator.lifecycle.services import Services

log = logging.getLogger(__name__)
FULL_AGAIN = ("ABORTED", "DATA_LOSS")  # a delta push's refusals that a full push of the same version mends

POLICY_INPUTS = ["input_ids", "attention_mask", "position_ids", "responses"]
POLICY_TENSORS = [*POLICY_INPUTS, "response_mask"]  # what an update of the actor or critic takes
INTERRUPTED_RESENDS = 3  # a Generate stopped by a weight push is sent again this many times at most


def replica_lost(e: ServiceError) -> bool:
    """An error that says the replica, not the request, failed: it is gone or hung, or holds torn weights."""
    if e.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return True
    return e.code == grpc.StatusCode.FAILED_PRECONDITION and "abandoned weight update" in (e.details or "")


@dataclasses.dataclass
class Mesh:
    cfg: Config
    clients: dict[str, Client]
    env_stop: list[str] = dataclasses.field(default_factory=list)  # the environment's turn-ending strings
    env_tools: list[dict] = dataclasses.field(default_factory=list)  # its tools' schemas (rollout.tool_parser)
    router: Router = dataclasses.field(init=False)
    weight_version: int = 0  # the version the last push gave the fleet (a replica brought back gets it)
    tokenizer: Any = None  # the actor's: decodes what reward.url sends (the prompts and sequences as seen)
    last_push: dict[str, float] = dataclasses.field(default_factory=dict)  # push/* metrics of the last push
    judge: Judge | None = None  # judge.*: grades each step's samples beside the reward service

    def __post_init__(self) -> None:
        self.router = Router([name for name in self.clients if is_replica(name)])

    @property
    def replicas(self) -> list[str]:
        """The rollout fleet's names ("rollout", "rollout-1", ...; fleet.replica_names)."""
        return self.router.names

    @property
    def ref_in_actor(self) -> bool:
        """The actor trains a LoRA adapter and no ref service was given: the ref is its base model, asked
        for with the adapter off (as verl does), so no second copy of the model is started."""
        return "ref" not in self.clients and ref_in_actor(self.cfg)

    def has(self, role: str) -> bool:
        return role in self.clients or role == "ref" and self.ref_in_actor

    def __getitem__(self, role: str) -> Client:
        return self.clients[role]

    # ---- rollout ---------------------------------------------------------------------

    def generate(
        self,
        prompts: DataProto,
        seed: int | None = None,
        *,
        n: int | None = None,
        greedy: bool = False,
        colocated: bool = True,
        stop: list[str] | None = None,
        max_new_tokens: int | None = None,
        replica: str | None = None,
    ) -> DataProto:
        """rollout.n samples of each prompt (greedy: one), prompt i with seed + i. `colocated=False`: the
        caller holds colocated_generation around this (several concurrent calls, orchestrator.sampling.chunks).
        `stop`, `max_new_tokens`: a multi-turn turn's own (orchestrator.sampling.multi_turn). `replica`: the
        replica the caller picked for the call (Router.pick, which counts it in flight); None: a fleet
        shares the prompts out."""
        r = self.cfg.rollout
        sampling = rollout_pb2.SamplingParams(
            n=n or (1 if greedy else r.n),
            greedy=greedy,
            temperature=r.temperature,
            top_p=r.top_p,
            top_k=r.top_k,
            max_new_tokens=max_new_tokens or r.max_new_tokens,
            logprobs=not greedy,
            seed=seed or 0,
            stop=stop or [],
            routed_experts=not greedy and self.cfg.actor.rollout_experts(),  # what training replays or compares with
        )
        request = rollout_pb2.GenerateRequest(sampling=sampling)
        samples = sampling.n * len(prompts)
        with self.colocated_generation() if colocated else contextlib.nullcontext():
            if replica is not None or len(self.replicas) <= 1 or len(prompts) < 2:
                return self._serve(Payload(request, prompts), samples, replica or self.router.pick(samples))
            return self._fan_out(prompts, request)

    def _fan_out(self, prompts: DataProto, request: rollout_pb2.GenerateRequest) -> DataProto:
        """One call's prompts over the fleet: a near-equal consecutive part per replica (prompt a + i of the
        call keeps seed + a + i), each to the least loaded replica in order, then joined as one reply."""
        bounds = [*starts(len(prompts), len(self.replicas)), len(prompts)]
        parts = []
        for a, b in zip(bounds, bounds[1:]):  # every part picked before any is sent: the picks see no call end
            part = rollout_pb2.GenerateRequest()
            part.CopyFrom(request)
            if request.sampling.HasField("seed"):
                part.sampling.seed = request.sampling.seed + a
            samples = part.sampling.n * (b - a)
            parts.append((Payload(part, prompts.slice(a, b)), samples, self.router.pick(samples)))
        with concurrent.futures.ThreadPoolExecutor(len(parts), thread_name_prefix="meshrl-fleet") as pool:
            futures = [pool.submit(self._serve, *part) for part in parts]
            return join_generations([f.result() for f in futures])

    def _serve(self, request: Payload, samples: int, name: str) -> DataProto:
        """A Generate on replica `name` (picked, so counted in flight): sent again, on the new weights, when
        a push interrupted it (rollout.on_update=interrupt); sent to another replica when this one is lost
        (fleet: marked down until the run brings it back). The last replica up fails as it failed."""
        while True:
            start, timeout = time.perf_counter(), self.router.deadline(samples)
            try:
                gen = self._interruptible(request, name, timeout)
            except ServiceError as e:
                self.router.done(name, samples, served=False)
                if not replica_lost(e) or self.router.up() == [name]:  # the request's fault, or the last one up
                    raise
                hung = e.code == grpc.StatusCode.DEADLINE_EXCEEDED and timeout is not None
                log.warning(
                    "rollout replica %s (%s) %s and is set aside; its call goes to another replica%s",
                    name,
                    self[name].address,
                    f"gave no answer in {timeout:.0f} s ({samples} samples)" if hung else "failed a Generate",
                    "" if hung else f": {e}",
                )
                self.router.mark_down(name)
                try:
                    name = self.router.pick(samples)
                except NoReplica:
                    raise e from None
                continue
            except BaseException:  # not the service's answer (e.g. interrupted here): no longer in flight
                self.router.done(name, samples, served=False)
                raise
            self.router.done(name, samples, served=True)
            self.router.timed(name, time.perf_counter() - start, samples)
            return gen

    def _interruptible(self, request: Payload, name: str, timeout: float | None = None) -> DataProto:
        for _ in range(INTERRUPTED_RESENDS):
            try:
                return self._generate(request, name, timeout)
            except ServiceError as e:  # a push interrupted it (rollout.on_update=interrupt): again, on new weights
                # details: None where the status carried no text
                if e.code != grpc.StatusCode.ABORTED or "interrupted" not in (e.details or ""):
                    raise
        return self._generate(request, name, timeout)  # the last resend: whatever stops it goes up

    def _generate(self, request: Payload, name: str = "rollout", timeout: float | None = None) -> DataProto:
        _, gen = self[name].call_batch("Generate", request, rollout_pb2.GenerateResponse, timeout=timeout)
        return gen

    @contextlib.contextmanager
    def colocated_generation(self):
        """rollout.colocate: the GPU goes to the rollout for a generation and back to the models that train
        after it, as verl's hybrid engine hands it over. The actor, ref and critic move their weights and
        optimizer state to host memory (Offload), the rollout wakes, generates and sleeps again (its KV
        cache freed), and they come back (Reload). A failed generation leaves them where they are: the
        step's redo swaps again, and a service computes only once its model is back."""
        if not self.cfg.rollout.colocate:
            yield
            return
        trained = [role for role in MODELS if self.has(role)]
        for role in trained:
            self[role].call("Offload", actor_pb2.OffloadRequest())
        for name in self.router.up():
            self[name].call("WakeUp", rollout_pb2.SleepRequest())
        yield
        for name in self.router.up():
            self[name].call("Sleep", rollout_pb2.SleepRequest(level=1))
        for role in trained:
            self[role].call("Reload", actor_pb2.OffloadRequest())

    def push_weights(self, version: int, rollback: bool = False, replicas: list[str] | None = None) -> float:
        """Actor weights to the rollout fleet (every replica up, or `replicas`) in one PushWeights (the
        config's transport); returns the seconds it took. A replica that did not take them is marked down
        (the others did; run.recovery.heal_fleet brings it back). A colocated rollout wakes its weights
        for it; its KV cache stays freed until it generates. rollback: the rollout takes `version` even
        below its own (the run went back to a checkpoint; a rollout given by address kept the newer weights).

        With delta pushes (rollout.push), a replica that cannot take the changes (it has no base of the
        version before: restarted, joined late, missed a push; or its base failed the checksum) gets the
        full weights right after, in a second push to it alone."""
        names = replicas if replicas is not None else self.router.up()
        if not names:
            raise NoReplica(f"no rollout replica is up to take weight version {version}")
        if self.cfg.rollout.colocate:
            for name in names:
                self[name].call("WakeUp", rollout_pb2.SleepRequest(tags=["weights"]))
        reply, failed = self._push_mending(names, version, rollback)
        self._mark_failed(names, version, failed)
        self.last_push = {
            "push/sent_mb": reply.sent_bytes / 2**20,
            "push/weights_mb": reply.num_bytes / 2**20,
            "push/delta": float(reply.delta),
        }
        if replicas is None or version > self.weight_version or rollback:
            self.weight_version = version
        return reply.seconds

    def _push_mending(
        self, names: list[str], version: int, rollback: bool
    ) -> tuple[actor_pb2.PushWeightsResponse, list]:
        """One push to `names`, then a full one to the replicas that refused its changes (FULL_AGAIN); the
        first push's reply (seconds and bytes of both) and the failures left."""
        delta = delta_push(self.cfg)
        try:
            reply = self._push(names, version, rollback, delta)
        except ServiceError as e:  # every replica failed: the rollout's own status
            if not (delta and e.code.name in FULL_AGAIN):
                raise
            reply = self._all_failed(names, e)
        again = [f for f in reply.failed if delta and f.code in FULL_AGAIN]
        failed = [f for f in reply.failed if f not in again]
        if again:
            address = {self[name].address: name for name in names}
            for f in again:
                say = log.warning if f.code == "DATA_LOSS" else log.info
                say("rollout replica %s takes weight version %d whole: %s", address[f.address], version, f.details)
            names_again = [address[f.address] for f in again]
            try:
                full = self._push(names_again, version, rollback, delta)
            except ServiceError as e:  # those replicas alone failed the full push: set aside, the rest stand
                full = self._all_failed(names_again, e)
            failed += list(full.failed)
            reply.seconds += full.seconds
            reply.sent_bytes += full.sent_bytes
            reply.num_bytes = reply.num_bytes or full.num_bytes
        return reply, failed

    def _all_failed(self, names: list[str], e: ServiceError) -> actor_pb2.PushWeightsResponse:
        """A push that raised, as a reply naming each of its replicas failed with its error."""
        lost = [actor_pb2.PushFailure(address=self[n].address, code=e.code.name, details=e.details) for n in names]
        return actor_pb2.PushWeightsResponse(failed=lost)

    def _push(self, names: list[str], version: int, rollback: bool, delta: bool) -> actor_pb2.PushWeightsResponse:
        return self["actor"].call_message(
            "PushWeights",
            actor_pb2.PushWeightsRequest(
                rollout_address=self[names[0]].address,
                more_rollout_addresses=[self[name].address for name in names[1:]],
                transport=self.cfg.rollout.weight_transport,
                version=version,
                bucket_bytes=self.cfg.rollout.weight_bucket_mb << 20,
                dtype=self.cfg.rollout.dtype,
                rollback=rollback,
                merge_lora=self.cfg.rollout.merge_lora,
                relay=self.cfg.rollout.weight_relay,
                delta=delta,
            ),
            actor_pb2.PushWeightsResponse,
        )

    def _mark_failed(self, names: list[str], version: int, failed: list) -> None:
        address = {self[name].address: name for name in names}
        for failure in failed:
            log.warning(
                "rollout replica %s (%s) did not take weight version %d and is set aside: %s: %s",
                address[failure.address],
                failure.address,
                version,
                failure.code,
                failure.details,
            )
            self.router.mark_down(address[failure.address])

    def fleet_metrics(self) -> dict[str, float]:
        """rollout/replica<i>/{samples, samples_per_s, in_flight, weight_version} since the last call, and
        rollout/replicas_up."""
        versions = {}
        for name in self.router.up():
            try:
                versions[name] = self[name].describe(timeout=10).weight_version
            except ServiceError:
                pass  # -1: it said nothing (the next call to it sets it aside)
        return self.router.metrics(versions)

    # ---- reward ----------------------------------------------------------------------

    def score(self, gen: DataProto, judged: bool = True):
        """The reward service's Scores for a Generate reply (only the columns a scorer reads travel), joined
        with the judge's where judge.* names one (judged=False: validation, graded by the reward alone)."""
        reward = self.clients["reward"]  # whichever client the service has now (a restart replaces it)
        # an OpenRLHF-style server reads the texts the model saw, which only this side can decode
        rendered = self.tokenizer if self.cfg.reward.url else None
        assert rendered is not None or not self.cfg.reward.url, "reward.url: start_mesh(..., tokenizer=) decodes"
        scored = RewardClient(reward.address, client=reward).score(reward_request(gen, rendered))
        if self.judge is None or not judged:
            return scored
        judges = [self.clients[n] for n in self.cfg.judge.names() if n in self.clients]
        return self.judge.grade(gen, scored, clients=judges)

    # ---- actor, ref, critic -----------------------------------------------------------

    def logprobs(self, role: str, batch: DataProto) -> torch.Tensor:
        """Per-token log-probs of the responses under the actor, the ref or the teacher, (B, T)."""
        key = "ref_logprobs" if role in FROZEN else "actor_logprobs"  # the teacher serves in the ref role
        base = role == "ref" and self.ref_in_actor  # the actor's base model answers it: ref_logprobs too
        message = actor_pb2.BatchRequest(temperature=self.cfg.rollout.temperature, without_adapter=base)
        # R3: the policy's passes replay the rollout's experts; a ref or teacher routes as its own weights do
        routed = (ROUTED,) if ROUTED in batch.batch and role == "actor" and self.cfg.actor.replay.rollouts else ()
        request = Payload(message, batch.select([*POLICY_INPUTS, *routed]))
        _, out = self["actor" if base else role].call_batch("ComputeLogProbs", request, actor_pb2.BatchResponse)
        return out.batch[key]

    def values(self, batch: DataProto) -> torch.Tensor:
        """The critic's value of each response position, (B, T)."""
        request = Payload(actor_pb2.BatchRequest(), batch.select(POLICY_INPUTS))
        _, out = self["critic"].call_batch("ComputeValues", request, actor_pb2.BatchResponse)
        return out.batch["values"]

    def update(self, role: str, step: int, loss: str, params: dict, batch: DataProto) -> dict[str, float]:
        """One update with this loss; only the tensors it reads travel (meshrl/config/losses.py
        update_inputs), not the rest of the step's batch (its texts, scores, returns it does not use)."""
        spec = actor_pb2.LossSpec(name=loss, params={k: to_value(v, k) for k, v in params.items()})
        try:
            reads = update_inputs(loss, build(PARAMS[loss], params, f"loss {loss}"), batch.batch)
            # a missing one: the actor says so; a vision-language task's pictures go with the tokens
            sent = batch.select(
                [k for k in reads if k in batch.batch],
                [k for k in modalities.COLUMNS if k in batch.non_tensor_batch],
                [],
            )
        except ValueError:  # parameters the loss refuses: the actor's refusal (InvalidArgument) names them
            sent = batch
        request = Payload(actor_pb2.UpdateRequest(step=step, loss=spec), sent)
        reply = self[role].call_message("Update", request, actor_pb2.UpdateResponse)
        return dict(reply.metrics)

    def save(self, role: str, path, export_hf: bool = False) -> None:
        self[role].call("SaveCheckpoint", actor_pb2.CheckpointRequest(path=absolute(path), export_hf=export_hf))

    def load(self, role: str, path) -> None:
        self[role].call("LoadCheckpoint", actor_pb2.CheckpointRequest(path=absolute(path)))


REWARD_COLUMNS = (
    "data_source",
    "reward_model",
    "extra_info",
    "ability",
    "uid",
    "response_text",
    "finish_reason",
    "dataset_columns",  # the rows' other columns, where a TRL-form reward function reads them (orchestrator.data)
)


def reward_request(gen: DataProto, tokenizer=None) -> DataProto:
    """What a Score request carries (docs/wire.md): per row the response and prompt text, data_source,
    reward_model, extra_info, dataset_columns (when the rows have them), and the responses with their
    response_mask; not the model inputs and log-probs, which no scorer needs. Given the tokenizer (for
    reward.url), also prompt_rendered and sequence_text, decoded from the token ids."""
    cols = gen.non_tensor_batch
    columns = {k: list(cols[k]) for k in REWARD_COLUMNS if k in cols}
    if "prompt" in cols:
        columns["prompt_text"] = [prompt_text(p) for p in cols["prompt"]]
    if tokenizer is not None:
        columns["prompt_rendered"] = rendered_prompts(gen, tokenizer)
        columns["sequence_text"] = rendered_sequences(gen, tokenizer)
    return DataProto({k: gen.batch[k] for k in ("responses", "response_mask") if k in gen.batch}, columns)


def rendered_prompts(gen: DataProto, tokenizer, k: int | None = None) -> list[str]:
    """The first k prompts (None: all) as the model saw them: the prompt token ids the rollout was given
    (left of the responses in input_ids, padding left out), decoded with the chat template's special
    tokens kept."""
    prompt_len = gen.batch["input_ids"].shape[1] - gen.batch["responses"].shape[1]  # prompts left padded
    return decoded(gen, tokenizer, prompt_len, k)


def rendered_sequences(gen: DataProto, tokenizer) -> list[str]:
    """Each row's prompt and response as one text, as OpenRLHF decodes its query: the token ids without
    padding, special tokens kept (the template's, and the response's end token, which a reward model
    trained by OpenRLHF reads its score at)."""
    return decoded(gen, tokenizer, gen.batch["input_ids"].shape[1])


def decoded(gen: DataProto, tokenizer, width: int, k: int | None = None) -> list[str]:
    """The first k rows' (None: all) first `width` positions of input_ids, padding left out, decoded."""
    ids, mask = gen.batch["input_ids"][:, :width], gen.batch["attention_mask"][:, :width]  # (B, width)
    return [tokenizer.decode(ids[i][mask[i].bool()].tolist()) for i in range(len(ids) if k is None else k)]


def start_mesh(cfg: Config, services: Services, roles: set[str], tokenizer=None) -> Mesh:
    """Start (or reach) the services in `roles`: actor, ref, critic, rollout, reward, env. `tokenizer`: the
    actor's (reward.url needs it)."""
    mesh = Mesh(cfg, services.start_all(wanted(cfg, roles)), tokenizer=tokenizer)
    if cfg.judge.given:
        mesh.judge = Judge(cfg.judge)
    if mesh.has("env"):
        details = mesh["env"].describe().details
        mesh.env_stop, mesh.env_tools = json.loads(details.get("stop", "[]")), json.loads(details.get("tools", "[]"))
    return mesh
