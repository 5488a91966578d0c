"""The ActorService on rank 0: check each request, split its batch over the ranks, gather the answer.

The caller never sees the world size. Update requests carry a step id: a step
at or below the last applied one returns that step's answer (or, if older,
FAILED_PRECONDITION) and changes nothing. A call whose caller goes away stops at
the next micro-batch (ABORTED); an Update stopped after some of its optimizer
steps leaves the weights between two steps, so the service then refuses to
update, save or push until a checkpoint is loaded. Checkpoints carry an integrity
record (services/actor/integrity.py): LoadCheckpoint loads only a folder a save
signed, checked before any rank reads it.
"""

import json
import logging
import math
import pathlib

from meshrl import disk, modalities, weights
from meshrl.codec import Payload
from meshrl.codec.values import from_value
from meshrl.config.actor import EngineConfig, OptimConfig, engine_for
from meshrl.config.losses import ROUTED, UPDATE_LOSSES, update_inputs
from meshrl.config.rollout import DTYPES
from meshrl.dataproto import DataProto, unpad
from meshrl.errors import MAX_STEP_ADVANCE, Aborted, FailedPrecondition, InvalidArgument, ServiceError, check_counter
from meshrl.flags import settings_json
from meshrl.hosts import is_address
from meshrl.models import check_lora
from meshrl.typed import build
from meshrl.v1 import actor_pb2, common_pb2
from meshrl.vocab import fingerprint, folder_tokenizer
from services.actor import batches, integrity
from services.actor.comm import Driver, RankError
from services.actor.losses import parse_loss
from services.actor.roles import KIND

STATE_FILE = "actor_service.json"
log = logging.getLogger(__name__)


class ActorServicer:
    SERVICE = actor_pb2.DESCRIPTOR.services_by_name["ActorService"]

    def __init__(self, role: str, driver: Driver, checkpoint_root: str | pathlib.Path = "."):
        self.role, self.driver = role, driver
        self.checkpoint_root = pathlib.Path(checkpoint_root).resolve()  # Save/Load stay under it
        self.world_size = driver.group.world_size
        self.init_args: dict | None = None
        self.limits: dict = {}  # from the model's config at init: what batches.validate checks ids against
        self.last_step = 0
        self.last_reply: actor_pb2.UpdateResponse | None = None
        self.weight_version = 0
        self.partial = ""  # why the weights are between two steps (a stopped Update); "" when they are not
        self.vocab_fingerprint: str | None = None  # the model folder's tokenizer's (_tokenizer), once read
        self.media: modalities.Readers | None = None  # the model's readers of pictures (meshrl/modalities), at init

    # ---- lifecycle ------------------------------------------------------------------

    def Describe(self, request, context) -> common_pb2.ServiceInfo:
        args = self.init_args or {}
        return common_pb2.ServiceInfo(
            service="actor",
            role=self.role,
            model=args.get("model", ""),
            world_size=self.world_size,
            backend=args.get("engine", {}).get("engine", EngineConfig.engine),
            weight_version=self.weight_version,
            details={
                "initialized": str(self.init_args is not None).lower(),
                "last_step": str(self.last_step),
                "partial": self.partial,
                "settings": self._settings(),
                "tokenizer": self._tokenizer(),
            },
        )

    def _tokenizer(self) -> str:
        """The model folder's tokenizer's fingerprint (meshrl.vocab), for a run to check that its teacher
        reads token ids as its student does; "" before Init or where the folder has no tokenizer."""
        model = (self.init_args or {}).get("model")
        if not model:
            return ""
        if self.vocab_fingerprint is None:  # once: hashing a 150k vocabulary is not for every Describe
            try:
                self.vocab_fingerprint = fingerprint(folder_tokenizer(model))
            except Exception as e:  # noqa: BLE001 - a folder without a readable tokenizer: nothing to check
                log.info("no tokenizer fingerprint for %s: %s", model, e)
                self.vocab_fingerprint = ""
        return self.vocab_fingerprint

    def _settings(self) -> str:
        """Engine and optimizer settings in effect, defaults filled in ("{}" before Init)."""
        if self.init_args is None:
            return "{}"
        return settings_json(
            build(EngineConfig, self.init_args["engine"], "engine"),
            build(OptimConfig, self.init_args["optim"], "optim"),
        )

    def Init(self, request: actor_pb2.InitRequest, context) -> common_pb2.ServiceInfo:
        args = self.init_args_from(request.model, _values(request.engine, "engine"), _values(request.optim, "optim"))
        return self.init(args)

    def init_args_from(self, model: str, engine: dict, optim: dict) -> dict:
        check_init(self.role, model, engine, optim)
        # "auto" is settled here, where the world size is known: the ranks and Describe see the engine in use
        engine = {**engine, "engine": engine_for(engine.get("engine", EngineConfig.engine), self.world_size)}
        return {"model": model, "engine": engine, "optim": optim}

    def init(self, args: dict) -> common_pb2.ServiceInfo:
        if self.init_args is not None:
            if args != self.init_args:
                raise FailedPrecondition("already initialized with other settings; start a new service to change them")
            return self.Describe(None, None)
        self._call("init", args)
        self.init_args = args
        config = json.loads(pathlib.Path(args["model"], "config.json").read_text())
        text = config.get("text_config") or config  # a vision-language model's language model
        self.limits = {
            "vocab_size": text.get("vocab_size"),  # ids the embedding holds, positions it encodes
            "positions": text.get("max_position_embeddings") or text.get("n_positions"),
            "experts": batches.routing_shape(config),  # a mixture of experts': what ROUTED must hold
        }
        self.media = modalities.Readers(args["model"], config)
        return self.Describe(None, None)

    # ---- compute --------------------------------------------------------------------

    def ComputeLogProbs(self, request: Payload, context) -> Payload:
        if self.role == "critic":
            raise InvalidArgument("the critic role computes values: call ComputeValues")
        msg = request.msg
        if not 0 <= msg.temperature < math.inf:
            raise InvalidArgument(f"BatchRequest.temperature must be a finite number >= 0, got {msg.temperature}")
        if msg.without_adapter and self.init_args is not None and not self._lora_rank():
            raise InvalidArgument(
                f"BatchRequest.without_adapter: this {self.role} service trains no LoRA adapter (lora_rank 0), "
                "so there is no adapter to switch off; the base model's log-probs come from a ref service"
            )
        args = {"temperature": msg.temperature or 1.0, "with_entropy": msg.with_entropy}
        out = self._compute(request, "logprobs", {**args, "without_adapter": msg.without_adapter}, context)
        return Payload(actor_pb2.BatchResponse(), out)

    def ComputeValues(self, request: Payload, context) -> Payload:
        if self.role != "critic":
            raise InvalidArgument(f"the {self.role} role computes log-probs: call ComputeLogProbs")
        return Payload(actor_pb2.BatchResponse(), self._compute(request, "values", {}, context))

    def _compute(self, request: Payload, method: str, args: dict, context) -> DataProto:
        self._require_init()
        data = self._data(request)
        batches.validate(data, batches.BASE, self.data_ranks, **self.limits)
        keys = [*batches.BASE, *([ROUTED] if ROUTED in data.batch else [])]  # experts to replay (R3)
        keys += [k for k in modalities.ROW_TENSORS if k in data.batch]
        parts, pad = batches.shard(data.select(keys), self.data_ranks)
        results = self.mine(self._call(method, args, self.spread(parts), context))
        return unpad(DataProto.concat([DataProto(r.batch) for r in results]), pad)

    @property
    def data_ranks(self) -> int:
        """Ranks that hold rows of their own: the world, or its groups under sequence parallelism."""
        return self.world_size // self._sequence_parallel()

    def _sequence_parallel(self) -> int:
        return int((self.init_args or {}).get("engine", {}).get("sequence_parallel", 1))

    def spread(self, parts: list[DataProto]) -> list[DataProto]:
        """One part per data rank -> one per rank: a sequence-parallel group's ranks get the same part."""
        return [p for p in parts for _ in range(self._sequence_parallel())]

    def mine(self, results: list[DataProto]) -> list[DataProto]:
        """Every rank's result -> one per data rank (a sequence-parallel group's ranks return the same)."""
        return results[:: self._sequence_parallel()]

    # ---- training -------------------------------------------------------------------

    def Update(self, request: Payload, context) -> actor_pb2.UpdateResponse:
        self._require_init()
        msg = request.msg
        if msg.step == 0:
            raise InvalidArgument("UpdateRequest.step must be > 0 (it makes retries safe)")
        check_counter(msg.step, "UpdateRequest.step")
        if msg.step > self.last_step + MAX_STEP_ADVANCE:
            raise InvalidArgument(
                f"UpdateRequest.step {msg.step} is more than {MAX_STEP_ADVANCE} past the last "
                f"applied step {self.last_step}"
            )
        if msg.step <= self.last_step:
            if msg.step == self.last_step and self.last_reply is not None:
                reply = actor_pb2.UpdateResponse()
                reply.CopyFrom(self.last_reply)
                reply.already_applied = True
                return reply
            raise FailedPrecondition(f"step {msg.step} is older than the last applied step {self.last_step}")
        self._require_whole()
        name = msg.loss.name
        params_dict = _values(msg.loss.params, "loss.params")
        params = parse_loss(self.role, name, params_dict)
        data = self._data(request)
        keys, unit = update_inputs(name, params, data.batch), UPDATE_LOSSES[name].unit
        batches.validate(data, tuple(keys), self.data_ranks, pairs=unit == 2, **self.limits)
        keys = [*keys, *(k for k in modalities.ROW_TENSORS if k in data.batch)]
        parts, _ = batches.shard(data.select(keys), self.data_ranks, unit=unit)
        try:
            results = self._call(
                "update",
                {"loss": name, "params": params_dict, "total_rows": len(data), "step": msg.step},
                self.spread(parts),
                context,
            )
        except Aborted as e:
            if e.meta.get("optimizer_steps"):
                self.partial = (
                    f"update step {msg.step} was stopped after {e.meta['optimizer_steps']} of its "
                    f"{e.meta['planned_steps']} optimizer steps (its caller went away)"
                )
                self.weight_version += 1  # these are not the weights of any version pushed before
            raise
        reply = actor_pb2.UpdateResponse(metrics=results[0].meta_info, step=msg.step)
        self.last_step, self.last_reply = msg.step, reply
        self.weight_version += 1
        return reply

    # ---- state ----------------------------------------------------------------------

    def SaveCheckpoint(self, request: actor_pb2.CheckpointRequest, context) -> actor_pb2.CheckpointResponse:
        self._require_init()
        self._require_whole()
        path = self._checkpoint_path(request)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:  # a file in the way, a full disk: the caller's path, named
            raise InvalidArgument(f"cannot make the checkpoint folder {request.path[:200]!r}: {e.strerror}") from None
        before = self._checked(integrity.snapshot, path)
        with disk.said_full(path, "the checkpoint"):  # a full disk: one line (RESOURCE_EXHAUSTED), not INTERNAL
            self._call("save", {"path": str(path), "export_hf": request.export_hf})
            state = {"last_step": self.last_step, "weight_version": self.weight_version, "role": self.role}
            (path / STATE_FILE).write_text(json.dumps({**state, "lora_rank": self._lora_rank()}))
            self._checked(lambda p: integrity.sign(p, before, integrity.checkpoint_key()), path)  # last: over it all
        return actor_pb2.CheckpointResponse(path=str(path), step=self.last_step)

    def LoadCheckpoint(self, request: actor_pb2.CheckpointRequest, context) -> actor_pb2.CheckpointResponse:
        self._require_init()
        path = self._checkpoint_path(request)
        if not (path / STATE_FILE).is_file():
            raise InvalidArgument(f"no actor checkpoint at {path} (missing {STATE_FILE})")
        # before anything in it is read: DCP unpickles its metadata, and a planted pickle runs
        self._checked(lambda p: integrity.verify(p, integrity.checkpoint_key()), path)
        try:
            state = json.loads((path / STATE_FILE).read_text())
            state = {k: state[k] for k in ("last_step", "weight_version", "role")} | {
                "lora_rank": state.get("lora_rank", 0)  # saved before LoRA: full weights
            }
        except (ValueError, TypeError, KeyError) as e:
            raise InvalidArgument(f"{path / STATE_FILE} is not an actor checkpoint's state: {e!r}") from None
        if state["role"] != self.role:
            raise InvalidArgument(f"checkpoint at {path} is of the {state['role']} role, this service is {self.role}")
        if state["lora_rank"] != self._lora_rank():
            raise InvalidArgument(
                f"checkpoint at {path} holds {_trained(state['lora_rank'])}; this service trains "
                f"{_trained(self._lora_rank())} (lora_rank)"
            )
        self._call("load", {"path": str(path)})
        self.last_step, self.weight_version, self.last_reply = state["last_step"], state["weight_version"], None
        self.partial = ""
        return actor_pb2.CheckpointResponse(path=str(path), step=self.last_step)

    @staticmethod
    def _checked(check, path: pathlib.Path):
        """check(path), its ValueError (an unsigned or altered folder, an unsafe key file) refused by name."""
        try:
            return check(path)
        except ValueError as e:
            raise FailedPrecondition(f"checkpoint at {path} refused: {e}") from None

    def _checkpoint_path(self, request) -> pathlib.Path:
        """The request's path under the checkpoint root (relative paths are taken from it), symlinks and
        `..` resolved; a path that leaves the root is refused before anything there is read or written
        (DCP unpickles a checkpoint's metadata), and the error says nothing of what exists there."""
        if not request.path:
            raise InvalidArgument("CheckpointRequest.path is empty")
        if "\0" in request.path or len(request.path) > 4096 or any(len(p) > 255 for p in request.path.split("/")):
            raise InvalidArgument(
                f"CheckpointRequest.path {request.path[:200]!r} is not a usable path (a NUL, "
                "a name over 255 bytes or a path over 4096)"
            )
        path = (self.checkpoint_root / request.path).resolve()
        if path != self.checkpoint_root and self.checkpoint_root not in path.parents:
            raise InvalidArgument(
                f"CheckpointRequest.path {request.path[:200]!r} is outside this service's "
                f"checkpoint root {self.checkpoint_root} (--checkpoint-root)"
            )
        return path

    def PushWeights(self, request: actor_pb2.PushWeightsRequest, context) -> actor_pb2.PushWeightsResponse:
        """Gather the weights bucket by bucket and send them to a rollout service (RankHandler.push_weights);
        it stops with its caller, as Update does (ABORTED), and never waits on the rollout past its deadline."""
        self._require_init()
        if self.role == "critic":
            raise InvalidArgument("a critic's weights are not a policy: push from the actor")
        self._require_whole()
        targets, version, transport = self._push_request(request)
        reply = self._call(
            "push_weights",
            {
                "dtype": request.dtype,
                "rollout_addresses": targets,
                "transport": transport,
                "version": version,
                "rollback": request.rollback,
                "merge_lora": request.merge_lora,  # without an adapter: the full weights, as always
                "relay": request.relay,
                "delta": request.delta,
                "bucket_bytes": request.bucket_bytes or weights.DEFAULT_BUCKET_BYTES,
                "seconds_left": context.time_remaining() if context is not None else None,
            },
            None,
            context,
        )[0].meta_info
        if self.driver.handler.push_failure is not None:
            raise self.driver.handler.push_failure  # as the rollout said it (a refused version stays refused)
        failed = [
            actor_pb2.PushFailure(
                address=address,
                code=e.code.name if isinstance(e, ServiceError) else "INTERNAL",
                details=(e.details or "") if isinstance(e, ServiceError) else f"{type(e).__name__}: {e}",
            )
            for address, e in self.driver.handler.push_failed.items()
        ]
        return actor_pb2.PushWeightsResponse(
            version=version,
            num_bytes=int(reply["num_bytes"]),
            seconds=reply["seconds"],
            failed=failed,
            sent_bytes=int(reply["sent_bytes"]),
            delta=bool(reply["delta"]),
        )

    def _push_request(self, request: actor_pb2.PushWeightsRequest) -> tuple[list[str], int, str]:
        """(the rollouts' addresses, the version, the transport) of a push, each checked before any rank works."""
        targets = [request.rollout_address, *request.more_rollout_addresses]
        for address in targets:
            if not is_address(address):
                raise InvalidArgument(
                    f"PushWeightsRequest rollout address {address[:200]!r} must be HOST:PORT with a port in 1..65535"
                )
        if len(set(targets)) < len(targets):
            raise InvalidArgument("PushWeightsRequest names a rollout address twice")
        version = request.version or self.weight_version
        if request.version:
            check_counter(version, "PushWeightsRequest.version")
        if version == 0:
            raise InvalidArgument(
                "nothing to push at version 0: the rollout already has the initial weights "
                "(or give PushWeightsRequest.version)"
            )
        transport = request.transport or "shm"
        if transport not in weights.TRANSPORTS:
            raise InvalidArgument(
                f"PushWeightsRequest.transport must be one of {list(weights.TRANSPORTS)}, got {transport[:50]!r}"
            )
        if request.delta and transport == "cuda_ipc":
            raise InvalidArgument(
                "PushWeightsRequest.delta is for shm and stream: over cuda_ipc nothing crosses a link to save"
            )
        if request.bucket_bytes and request.bucket_bytes < weights.ALIGN:
            raise InvalidArgument(
                f"PushWeightsRequest.bucket_bytes must be 0 (the default, "
                f"{weights.DEFAULT_BUCKET_BYTES >> 20} MiB) or >= {weights.ALIGN}"
            )
        if request.dtype and request.dtype not in DTYPES:
            raise InvalidArgument(
                f"PushWeightsRequest.dtype must be one of {list(DTYPES)} or empty, got {request.dtype[:50]!r}"
            )
        return targets, version, transport

    def Offload(self, request, context) -> actor_pb2.OffloadResponse:
        self._require_init()
        return actor_pb2.OffloadResponse(device=self._call("offload")[0].meta_info["device"])

    def Reload(self, request, context) -> actor_pb2.OffloadResponse:
        self._require_init()
        return actor_pb2.OffloadResponse(device=self._call("reload")[0].meta_info["device"])

    # ---- helpers --------------------------------------------------------------------

    def _data(self, request: Payload) -> DataProto:
        """The request's batch; what a multimodal model's forward reads beside the tokens (a vision-language
        model's pictures, an `images` column of encoded bytes: meshrl/modalities) made into its row tensors,
        checked against the prompts' tokens."""
        if request.data is None:
            raise InvalidArgument("the request has no data")
        data = request.data
        batches.check_sequences(data)  # before the prompts are cut out of input_ids below
        ids = data.batch.get("input_ids")
        if ids is not None and "responses" in data.batch:  # where the pictures go: the prompts (a sampled
            ids = ids[:, : ids.shape[1] - data.batch["responses"].shape[1]]  # response may hold the token too)
        assert self.media is not None  # _require_init ran
        try:
            rows = self.media.batch(data.non_tensor_batch, ids)
        except modalities.MediaError as e:
            raise InvalidArgument(str(e)) from None
        return DataProto({**data.batch, **rows}, data.non_tensor_batch, data.meta_info) if rows else data

    def _require_init(self) -> None:
        if self.init_args is None:
            raise FailedPrecondition("the actor service is not initialized: call Init first")

    def _lora_rank(self) -> int:
        """The rank of the adapter this service trains; 0: none (the ref is the base model, whatever it was
        given)."""
        if self.init_args is None or self.role == "ref":
            return 0
        return int(self.init_args["engine"].get("lora_rank", 0))

    def _require_whole(self) -> None:
        if self.partial:
            raise FailedPrecondition(f"{self.partial}: the weights are between two steps; LoadCheckpoint first")

    def _call(self, method: str, args: dict | None = None, parts=None, context=None) -> list[DataProto]:
        """Run `method` on every rank; with the call's context, a caller that goes away stops it (ABORTED)."""
        try:
            return self.driver.call(method, args, parts, context.is_active if context is not None else None)
        except RankError as e:
            if e.error_type == "Cancelled":
                raise Aborted(str(e), e.meta) from None
            if e.error_type == disk.DiskFull.__name__:  # said by the rank, of its own disk (handler.save)
                raise disk.DiskFull(str(e)) from None
            cls = InvalidArgument if e.error_type in ("ValueError", "InvalidArgument") else RuntimeError
            raise cls(str(e)) from None


def check_init(role: str, model: str, engine: dict, optim: dict) -> None:
    """InvalidArgument, in one line, for an Init the ranks would fail on: refused before any rank starts
    (main.py checks its flags with it before it starts the ranks)."""
    if not model:
        raise InvalidArgument("InitRequest.model is empty")
    if not pathlib.Path(model, "config.json").is_file():
        raise InvalidArgument(f"model {model!r} is not a HuggingFace folder (no config.json)")
    engine_cfg = build(EngineConfig, engine, "engine")
    build(OptimConfig, optim, "optim")
    if engine_cfg.lora_rank and role != "ref":  # an adapter the model cannot take (the model read on meta)
        try:
            check_lora(model, KIND[role], engine_cfg)
        except ValueError as e:
            raise InvalidArgument(str(e)) from None


def _trained(lora_rank: int) -> str:
    return f"a LoRA adapter of rank {lora_rank}" if lora_rank else "full weights"


def _values(mapping, where: str) -> dict:
    return {k: from_value(v, f"{where}.{k}") for k, v in mapping.items()}
