"""The RolloutService: Generate, the weight-update protocol, Sleep and WakeUp.

Generate calls run side by side (vLLM batches them together; the HF backend
takes them in turn). A weight update, Sleep or WakeUp first lets the calls in
flight finish, or with on_update=interrupt stops them (they end ABORTED, to be
sent again); a Generate that arrives meanwhile, while an update is open, after
a bucketed update was abandoned halfway (the weights are torn), or while any
part of the engine is asleep, is FAILED_PRECONDITION. A sleeping engine takes
new weights once its weights are awake (WakeUp with tags, as verl wakes vLLM's
weights before its KV cache). Every reply carries the weight version that
generated it: one version per call, as the weights never change under a call.

With on_update=keep (or recompute: the calls in flight compute their KV again from their tokens on the
new weights, vLLM by preempting them, the HF backend at its next step) an update does not wait for the
calls in flight: they pause between engine steps while it loads and go on with the new weights and the KV
cache they had (services/rollout/gate.py); a Generate sent while an update is
open is refused as in the other modes. Each reply then carries `rollout_versions`, the
version that produced each response token, and its weight_version is the
oldest of them.

An update may be a LoRA adapter instead (rollout.max_lora_rank > 0): from then
on the engine generates with its base weights and that adapter, until the next
adapter replaces it or a full-weights update drops it (a full push holds all the
policy: one with an adapter merged into it must not get the adapter again).

A stream push to a fleet across hosts may arrive as a chain (services/rollout/relay.py):
SendWeights then passes each bucket on to the next replica while this one loads it.
"""

import contextlib
import dataclasses
import importlib
import threading

import grpc
from transformers import AutoConfig, AutoTokenizer

from meshrl import file_layout, telemetry
from meshrl.codec import Payload
from meshrl.codec.rawbytes import decode_bytes_field
from meshrl.config.rollout import BACKENDS, IN_FLIGHT, RolloutConfig
from meshrl.errors import Aborted, FailedPrecondition, InvalidArgument, details_for, status_for
from meshrl.flags import settings_json
from meshrl.layout import VERSIONS
from meshrl.modalities.vision import is_vision
from meshrl.rpc.methods import raw_request
from meshrl.v1 import common_pb2, rollout_pb2
from services.rollout import layout
from services.rollout.gate import Gate
from services.rollout.relay import Relay
from services.rollout.sampling import from_proto
from services.rollout.weights import WeightReceiver, checkpoint_shapes

SLEEP_PARTS = ("weights", "kv_cache")  # vLLM's sleep tags, in the order an engine wakes them


@dataclasses.dataclass(eq=False)
class Call:
    """A Generate in flight."""

    context: grpc.ServicerContext | None  # None: the servicer called directly, not over gRPC
    interrupted: int | None = None  # the version of the update that stopped it
    gate: Gate | None = None  # on_update=keep: where it pauses while an update loads
    versions: list[int] = dataclasses.field(default_factory=list)  # keep: each engine step's weights, in order
    running: bool = False  # keep: between gate.enter and gate.leave
    first_update: int = 0  # keep: the gate's count of updates loaded when it started

    def active(self) -> bool:
        return self.interrupted is None and (self.context is None or self.context.is_active())

    def alive(self) -> bool:
        """What the backend asks between engine steps; with a gate, the step to come waits out an update
        loading, and its version is noted."""
        if not self.active():
            return False
        if self.gate is None or not self.running:
            return True
        version = self.gate.step(self.active)
        if version is None:  # its caller left while it was parked
            self.running = False
            return False
        self.versions.append(version)
        return True

    @contextlib.contextmanager
    def generating(self):
        """Around the backend's generate: through the gate (keep), and out of it however it ends."""
        if self.gate is not None:
            version = self.gate.enter(self.active)
            if version is None:
                raise Aborted("the caller cancelled or its deadline passed while a weight update loaded")
            # no update can load while it runs, so the count is the one its start saw
            self.versions, self.running, self.first_update = [version], True, len(self.gate.updates)
        try:
            yield
        finally:
            if self.running:
                assert self.gate is not None
                self.gate.leave()
                self.running = False


BACKEND_CLASSES = {  # rollout.backend -> (module, class); imported when chosen (vLLM takes seconds to import)
    "vllm": ("services.rollout.backend_vllm", "VLLMBackend"),
    "hf": ("services.rollout.backend_hf", "HFBackend"),
}
assert BACKEND_CLASSES.keys() == set(BACKENDS)


def make_backend(cfg: RolloutConfig):
    module, name = BACKEND_CLASSES[cfg.backend]
    return getattr(importlib.import_module(module), name)(cfg)


def modules_of(config) -> dict[str, list[int]] | None:
    """A vision-language model's parameters by its own names (an adapter is named by them; its files keep
    another layout), from the model built on the meta device; None for the rest, whose adapters are named
    as their files."""
    if not is_vision(config):
        return None
    return {n: list(p.shape) for n, p in file_layout.shell(config).named_parameters()}


class RolloutServicer:
    SERVICE = rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"]

    def __init__(self, cfg: RolloutConfig, backend=None):
        self.cfg = cfg
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.model)
        self.pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        config = AutoConfig.from_pretrained(cfg.model)
        tied_names = file_layout.tied(file_layout.shell(config))  # what a push may name a tied head
        tied = bool(getattr(config, "tie_word_embeddings", False)) or bool(tied_names)
        self.vocab_size = getattr(config, "vocab_size", None) or len(self.tokenizer)
        heads = {"lm_head.weight", *tied_names}
        self.receiver = WeightReceiver(checkpoint_shapes(cfg.model), tied, cfg.max_lora_rank, modules_of(config), heads)
        self.backend = backend or make_backend(cfg)
        self.version = 0
        self.lora_rank, self.lora_version = 0, 0  # the adapter in use (its rank, the update it came in); 0: none
        self.asleep: set[str] = set()  # parts of the engine put to sleep (SLEEP_PARTS)
        self.torn = False  # some buckets of an unfinished update are in the engine
        self.lock = threading.Condition()  # over the state above; held through updates, Sleep and WakeUp
        self.calls: list[Call] = []  # Generates in flight
        self.draining = 0  # updates (or Sleeps) waiting for them
        self.relays: dict = {}  # next hops of relayed pushes (address -> Client), kept across updates
        self.turn = contextlib.nullcontext() if self.backend.concurrent else threading.Lock()
        self.gate = Gate(self.version) if cfg.on_update in IN_FLIGHT else None

    def Describe(self, request, context) -> common_pb2.ServiceInfo:
        return common_pb2.ServiceInfo(
            service="rollout",
            model=self.cfg.model,
            backend=self.backend.name,
            weight_version=self.version,
            world_size=self.cfg.tensor_parallel_size,
            details={
                "sleeping": str(bool(self.asleep)).lower(),
                "max_model_len": str(self.cfg.max_model_len),
                "update_in_progress": str(self.receiver.in_progress).lower(),
                "torn": str(self.torn).lower(),
                "generations_in_flight": str(len(self.calls)),
                "concurrent": str(self.backend.concurrent).lower(),
                "lora_rank": str(self.lora_rank),
                "lora_version": str(self.lora_version),
                "settings": settings_json(self.cfg),
            },
        )

    def Generate(self, request: Payload, context) -> Payload:
        if request.data is None:
            raise InvalidArgument("GenerateRequest.data is missing")
        if not request.msg.HasField("sampling"):
            raise InvalidArgument("GenerateRequest.sampling is missing")
        sampling = from_proto(request.msg.sampling)
        if len(request.data) * sampling.n > self.cfg.max_samples:
            raise InvalidArgument(
                f"{len(request.data)} prompts x sampling.n {sampling.n} exceeds the rollout's "
                f"limit of {self.cfg.max_samples} samples per Generate (--max-samples)"
            )
        with telemetry.span("rollout.prompts"):  # the phases of a call, as child spans of its server span
            prompts = layout.read_prompts(
                request.data, self.tokenizer, self.cfg.max_model_len, sampling.max_new_tokens, self.vocab_size
            )
            media = layout.read_media(request.data, self.backend)
        call, version = self._admit(context)
        try:
            with self.turn:
                if not call.alive():  # it waited behind another and its caller left (or an update came)
                    raise Aborted("the caller cancelled or its deadline passed before generation started")
                with telemetry.span("rollout.engine", backend=self.backend.name), call.generating():
                    completions = self.backend.generate(prompts, sampling, call.alive, **media)
        except Aborted:
            if call.interrupted is not None:
                raise Aborted(
                    f"weight update {call.interrupted} interrupted this generation (the rollout runs "
                    "with on_update=interrupt): send it again"
                ) from None
            raise
        finally:
            with self.lock:
                self.calls.remove(call)
                self.lock.notify_all()
        with telemetry.span("rollout.layout"):
            out = layout.build(request.data, prompts, completions, self.pad, sampling.logprobs)
        if self.gate is not None:  # each token's weights; the call's version is the oldest among them
            rows = [c for cs in completions for c in cs]
            updates = [call.versions[0], *self.gate.updates[call.first_update :]]
            versions = layout.token_versions(out.batch["response_mask"], rows, call.versions, updates)
            out.batch[VERSIONS] = versions
            real = versions[out.batch["response_mask"] > 0]
            version = int(real.min()) if len(real) else call.versions[0]
        out.meta_info["weight_version"] = version
        return Payload(rollout_pb2.GenerateResponse(weight_version=version), out)

    def _admit(self, context) -> tuple[Call, int]:
        """A Generate counted in flight, with the weight version it starts on; FailedPrecondition while the
        engine cannot generate (an update or Sleep waiting, an update in progress or torn, asleep)."""
        with self.lock:
            if self.draining:
                raise FailedPrecondition(
                    "a weight update or Sleep is waiting for the generations in flight: send this after it"
                )
            if self.receiver.in_progress:  # (keep too: one parked at the gate would hold a server slot)
                raise FailedPrecondition(f"weight update {self.receiver.version} is in progress: finish it first")
            if self.torn:
                raise FailedPrecondition(
                    "the engine holds part of an abandoned weight update (it was sent in "
                    "buckets and never finished): push a complete update first"
                )
            if self.asleep:
                raise FailedPrecondition(
                    f"the rollout engine is asleep ({', '.join(sorted(self.asleep))}): call WakeUp first"
                )
            call = Call(context, gate=self.gate)
            self.calls.append(call)
            return call, self.version

    def BeginWeightUpdate(self, request, context) -> rollout_pb2.WeightUpdateStatus:
        with self.lock:
            self._require_awake("loading weights")
            lora = request.lora if request.HasField("lora") else None
            if lora is not None and self.torn:
                raise FailedPrecondition(
                    "the engine holds part of an abandoned weight update: push the full weights before an adapter"
                )
            # a torn engine takes its own version again: the sender that broke off pushes what it had
            floor = self.version - 1 if self.torn else self.version
            name = self.receiver.begin(request, floor)
            self.backend.restart_update()  # an abandoned update's engine phases, if any, are not continued
            # checked and open (new Generates are refused): now the ones in flight finish or stop, or (keep)
            # go on until the update loads
            if self.gate is None:
                self._quiesce(request.version if self.cfg.on_update == "interrupt" else None)
            shm = request.transport == "shm"
            return self._status(shm_segment=name if shm else "", shm_nonce=self.receiver.nonce if shm else b"")

    @raw_request
    def SendWeights(self, parts, context) -> rollout_pb2.WeightUpdateStatus:
        # Raw bytes in: each bucket's data is read as a view and copied once, into the staging segment; a
        # chained push's messages go on to the next replica as they come (relay_to), while this one loads.
        left = context.time_remaining() if context is not None else None
        relay = Relay(self.relays, 0.95 * left if left else None)  # the next hop ends first, so this one can reply
        teed = relay.tee(parts)
        buckets = (decode_bytes_field(rollout_pb2.WeightBucket, part, "data") for part in teed)
        with self.lock:
            try:
                self._take(buckets)
                status = self._status()
            except Exception as e:
                if not relay.drain(teed):
                    raise
                # a chain: its own failure said in the reply, which also says how the replicas below fared
                status = self._status()
                status.error_code, status.error_details = status_for(e).name, details_for(e)
        missed, why = relay.result()
        status.relay_missed.extend(missed)
        status.relay_error = why
        return status

    def _take(self, buckets) -> None:
        """A SendWeights call's bucket: received, and with several buckets loaded into the engine now, so the
        next may reuse the staging space."""
        refs = self.receiver.receive(buckets)
        if refs:
            self._require_awake("loading weights")
            if self.gate is not None:  # no step may see part of an update: paused until it finishes
                self.gate.pause()
            self.torn = True
            self._load(
                refs,
                self.receiver.transport.name,
                self.receiver.cuda_ipc,
                self.receiver.staging,
                reused=not self.receiver.keeping,  # the staging space takes the next bucket; a base does not
            )

    def FinishWeightUpdate(self, request, context) -> rollout_pb2.WeightUpdateStatus:
        with self.lock:
            loaded = False
            try:
                done = self.receiver.finish(request.version)
                self._require_awake("loading weights")
                if self.gate is not None:  # the steps in flight end, then wait for the load
                    self.gate.pause()
                if done.adapter is not None:
                    self.backend.load_lora(done.adapter)
                    self.lora_rank, self.lora_version = done.adapter.rank, request.version
                else:
                    if done.refs:
                        self.torn = True  # until it has all loaded: a load that fails halfway leaves it torn
                        self._load(done.refs, done.transport, done.cuda_ipc, done.segment)
                    self.backend.weights_loaded()
                    self.torn = False
                self.version, loaded = request.version, True
            finally:
                if self.gate is not None and not self.torn:  # torn: paused calls wait for a whole update
                    self.gate.resume(self.version, loaded)
            return self._status(num_tensors=done.num_tensors)

    def _load(self, refs: list[list], transport: str, ipc: list | None, segment: str, reused: bool = False) -> None:
        """Full weights (the backend drops its adapter first). ipc: for cuda_ipc, the handles of the bucket's
        copies (one per sender GPU); segment: for shm and stream, the one the bucket lies in."""
        self.lora_rank, self.lora_version = 0, 0
        if transport == "cuda_ipc":
            self.backend.load_weights_cuda_ipc(ipc, refs, reused)
        else:
            assert segment  # staged at Begin for the shm and stream transports
            self.backend.load_weights(segment, refs, reused)

    def _quiesce(self, interrupt: int | None = None) -> None:
        """With the lock held: until no Generate is in flight, refusing new ones meanwhile. `interrupt`
        (an update's version) stops those in flight at their next token instead of letting them finish."""
        for call in self.calls if interrupt is not None else ():
            call.interrupted = interrupt
        self.draining += 1
        try:
            self.lock.wait_for(lambda: not self.calls)
        finally:
            self.draining -= 1

    def _require_awake(self, doing: str) -> None:
        if "weights" in self.asleep:
            raise FailedPrecondition(
                f"the rollout engine's weights are asleep: call WakeUp (tags: weights) before {doing}"
            )

    def Sleep(self, request, context) -> rollout_pb2.SleepResponse:
        if request.level > 2:
            raise InvalidArgument(f"SleepRequest.level must be 0, 1 or 2, got {request.level}")
        with self.lock:
            self._quiesce()
            if self.asleep != set(SLEEP_PARTS):
                if self.asleep:  # half awake: whole again first, so the engine frees each part once
                    self.backend.wake_up(sorted(self.asleep))
                self.backend.sleep(request.level or 1)
                self.asleep = set(SLEEP_PARTS)
            return self._sleep_status()

    def WakeUp(self, request, context) -> rollout_pb2.SleepResponse:
        unknown = set(request.tags) - set(SLEEP_PARTS)
        if unknown:
            raise InvalidArgument(f"WakeUp tags must be among {list(SLEEP_PARTS)}, got {sorted(unknown)}")
        with self.lock:
            self._quiesce()
            parts = [p for p in SLEEP_PARTS if p in self.asleep and (not request.tags or p in request.tags)]
            if parts:
                self.backend.wake_up(parts)
                self.asleep -= set(parts)
            return self._sleep_status()

    def _sleep_status(self) -> rollout_pb2.SleepResponse:
        return rollout_pb2.SleepResponse(sleeping=bool(self.asleep), asleep=sorted(self.asleep))

    def _status(self, **kw) -> rollout_pb2.WeightUpdateStatus:
        r = self.receiver
        kw.setdefault("num_tensors", len(r.refs))
        return rollout_pb2.WeightUpdateStatus(
            version=r.version or self.version, num_bytes=r.data_bytes, in_progress=r.in_progress, **kw
        )

    def close(self) -> None:
        for client in self.relays.values():
            client.close()
        self.receiver.close()
        self.backend.close()
