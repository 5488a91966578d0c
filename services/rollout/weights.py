"""The receiving side of a weight update: Begin, one SendWeights call per bucket, Finish.

Every tensor must name a parameter of the model with its shape, each exactly
once. An update that fits one bucket is loaded at Finish, and only when
complete, so a bad one leaves the previous weights in use. An update of several
buckets is loaded a bucket at a time as each arrives (the servicer does it), so
memory stays bounded by the bucket, not the model; until such an update is
finished, the weights in the engine are `torn` (no version's) and generation is
refused. The staging segment in /dev/shm is one bucket in size, kept and reused
across updates (growing when needed); each update seals it anew (meshrl.shm.seal), and
Begin's reply carries the nonce, without which the sender does not write into it.
Replicas on the sender's host may instead read a bucket from another replica's segment
(WeightBucket.shm_source), so the sender writes it once per host: only a segment
sealed for this update by its owner, checked as the sender checks its own.

An update may instead be a LoRA adapter (BeginWeightUpdateRequest.lora): its
tensors are peft's (adapter_shapes), checked the same way, copied out of the
staging space bucket by bucket and handed to the engine whole at Finish, so a
bad adapter update never tears anything and leaves the previous one in use.

An update may keep a base (Begin's keep_base) or send only the changes from it (delta_base): the buckets'
tensors are applied to the base (services/rollout/base.py) and loaded from there; meshrl/delta.py.
"""

import dataclasses
import logging
import math
from collections.abc import Collection

import torch
from safetensors import safe_open

from meshrl.delta import SAME, SPARSE, WHOLE, index_dtype
from meshrl.errors import Aborted, FailedPrecondition, InvalidArgument, check_counter
from meshrl.shm import SEAL_BYTES, WEIGHT_PREFIX, Segment, open_sealed, seal
from meshrl.v1 import rollout_pb2
from meshrl.weights import ALIGN, ref_dtype, wire_nbytes
from services.rollout import transports
from services.rollout.base import Base
from services.rollout.transports import RECEIVERS

log = logging.getLogger(__name__)
PEFT_PREFIX = "base_model.model."  # peft's names are those of a PeftModel, which wraps the HF model twice


def checkpoint_shapes(model_dir: str) -> dict[str, list[int]]:
    """Parameter names and shapes as the model folder's safetensors hold them."""
    import pathlib

    files = sorted(pathlib.Path(model_dir).glob("*.safetensors"))
    if not files:
        raise ValueError(f"no .safetensors files in {model_dir}")
    shapes = {}
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for k in st.keys():
                shapes[k] = list(st.get_slice(k).get_shape())
    return shapes


def adapter_shapes(shapes: dict[str, list[int]], rank: int, targets: list[str]) -> dict[str, list[int]]:
    """peft's names and shapes of a rank-`rank` LoRA adapter of the model whose weights have `shapes`:
    PEFT_PREFIX + module + ".lora_A.weight" (rank, in) and ".lora_B.weight" (out, rank) for each linear
    layer of a block (a 2-D weight under a numbered module: model.layers.3.self_attn.q_proj) whose name
    is a target or ends with "." + a target, as peft matches a list of target_modules."""
    out: dict[str, list[int]] = {}
    unmatched = set(targets)
    for name, shape in shapes.items():
        module, _, leaf = name.rpartition(".")
        if leaf != "weight" or len(shape) != 2 or not any(p.isdigit() for p in module.split(".")):
            continue
        hits = {t for t in targets if module == t or module.endswith("." + t)}
        if hits:
            unmatched -= hits
            out[f"{PEFT_PREFIX}{module}.lora_A.weight"] = [rank, shape[1]]
            out[f"{PEFT_PREFIX}{module}.lora_B.weight"] = [shape[0], rank]
    if unmatched:
        raise InvalidArgument(
            f"LoraAdapter.target_modules {sorted(unmatched)}: no linear layer of this model's blocks is named so "
            "(an adapter of another model?)"
        )
    return out


def max_bytes(expected: dict[str, list[int]], doubled: bool) -> int:
    """The most a sender may announce: every tensor (twice with a tied head) at 8 bytes an element, aligned.
    More would commit /dev/shm on a caller's word (512 MiB once, for a 3M-parameter model)."""
    numel = sum(math.prod(shape) for shape in expected.values())
    return (numel * (2 if doubled else 1) * 8 + ALIGN * (len(expected) + 1)) or ALIGN


@dataclasses.dataclass
class Adapter:
    """A LoRA adapter received whole. tensors: peft's names (adapter_shapes), on the CPU."""

    rank: int
    alpha: float
    target_modules: list[str]
    tensors: dict[str, torch.Tensor]


@dataclasses.dataclass
class Finished:
    """What an update leaves to load at Finish: the weights' refs [name, dtype, shape, offset] (all of them
    for one bucket, [] for several), the transport, the CUDA IPC handles [UUID, fields] of the bucket's
    copies (or None); or the adapter, whole."""

    refs: list[list]
    transport: str
    cuda_ipc: list | None
    adapter: Adapter | None
    num_tensors: int
    segment: str = ""  # shm, stream: the segment the refs lie in


class WeightReceiver:
    def __init__(
        self,
        shapes: dict[str, list[int]],
        tied_embeddings: bool,
        max_lora_rank: int = 0,
        modules: dict[str, list[int]] | None = None,
        heads: Collection[str] = ("lm_head.weight",),
    ):
        """modules: the parameters by the loaded model's own names where an adapter is named by those, not by
        the files' (a vision-language model, whose files keep Qwen2-VL's older layout). heads: the names a
        push gives the model's tied weights (file_layout.tied: Gemma-3's language_model.lm_head.weight,
        BioGPT's output_projection.weight)."""
        self.shapes = shapes  # the model's parameters: what a full update holds
        self.modules = modules or shapes  # what an adapter's names are of
        # a tied lm_head is the embedding: senders may include it, the engine does not want it
        self.tied = set(heads) - shapes.keys() if tied_embeddings else set()
        self.max_lora_rank = max_lora_rank
        self.segment: Segment | None = None
        self.nonce = b""  # the segment's seal for the update in progress (shm, stream)
        self.version = 0  # the update in progress; 0 when none
        self.base = Base()  # the weights as last received, for delta pushes (empty unless one keeps it)
        self._reset()

    def _reset(self) -> None:
        self.version, self.transport, self.total, self.bucket_bytes = 0, RECEIVERS["shm"], 0, 0
        self.refs: dict = {}
        self.received = 0  # bytes of the tensors announced so far
        self.data_bytes = 0  # stream: bytes received in this bucket (several buckets) or in all (one)
        self.cuda_ipc: list | None = None  # cuda_ipc: the handles of the sender's bucket, a copy per GPU
        self.source: Segment | None = None  # shm: another replica's segment this bucket lies in, if not ours
        self.expected, self.skip = self.shapes, self.tied  # what the update holds: the weights or an adapter
        self.lora: rollout_pb2.LoraAdapter | None = None  # set: the update is this adapter
        self.adapter: dict[str, torch.Tensor] = {}  # the adapter's tensors of the buckets received
        self.keeping = self.delta = False  # the update keeps a base; it holds the changes from the base

    @property
    def in_progress(self) -> bool:
        return self.version != 0

    @property
    def bucketed(self) -> bool:
        """Several buckets: each is loaded as it arrives."""
        return self.bucket_bytes < self.total

    def begin(self, request: rollout_pb2.BeginWeightUpdateRequest, current: int) -> str:
        """Start the update `request` describes on top of weight version `current`; the staging segment's name."""
        version, transport, total_bytes, bucket_bytes = (
            request.version,
            request.transport,
            request.total_bytes,
            request.bucket_bytes,
        )
        rollback, keep_base, delta_base = request.rollback, request.keep_base, request.delta_base
        lora = request.lora if request.HasField("lora") else None
        check_counter(version, "BeginWeightUpdateRequest.version")
        if version <= current and not rollback:
            raise FailedPrecondition(f"weight version {version} is not newer than the version in use ({current})")
        way = transports.transport(transport)
        way.check()
        self._check_base(keep_base, delta_base, current, way.staged and lora is None)
        expected, skip = (self._adapter_shapes(lora), set()) if lora is not None else (self.shapes, self.tied)
        most = max_bytes(expected, bool(skip))
        if not 0 < total_bytes <= most:
            raise InvalidArgument(
                f"total_bytes must be in 1..{most} (this {'adapter' if lora else 'model'}'s "
                f"{'tensors' if lora else 'weights'} at 8 bytes an element), got {total_bytes}"
            )
        bucket_bytes = bucket_bytes or total_bytes
        if bucket_bytes > total_bytes:
            raise InvalidArgument(f"bucket_bytes {bucket_bytes} is more than total_bytes {total_bytes}")
        if self.in_progress:
            log.warning("weight update %d abandoned for %d", self.version, version)
        self._reset()
        name, self.nonce = "", b""
        if way.staged:
            if self.segment is None or self.segment.size - SEAL_BYTES < bucket_bytes:
                if self.segment is not None:  # else reuse
                    self.segment.unlink()
                self.segment = Segment.create(bucket_bytes + SEAL_BYTES, prefix=WEIGHT_PREFIX)
            # a fresh seal per update: a sender holding an older one (an abandoned update) writes no more
            name, self.nonce = self.segment.name, seal(self.segment)
        self.version, self.transport, self.total, self.bucket_bytes = version, way, total_bytes, bucket_bytes
        self.expected, self.skip, self.lora = expected, skip, lora
        self.keeping, self.delta = keep_base or bool(delta_base), bool(delta_base)
        if delta_base:
            self.base.version = 0  # until this update finishes
        elif keep_base:
            self.base.start(total_bytes)
        elif lora is None:
            self.base.drop()  # full pushes that keep none: its memory goes back
        return name

    def _check_base(self, keep: bool, delta_base: int, current: int, full_staged: bool) -> None:
        if (keep or delta_base) and not full_staged:
            raise InvalidArgument("keep_base and delta_base are for the full weights over shm or stream")
        if delta_base and not (self.base.version == delta_base == current):
            held = f"a base of version {self.base.version}" if self.base.version else "no base"
            raise Aborted(
                f"a delta from weight version {delta_base} came, but this rollout holds {held} at version "
                f"{current}: push the full weights"
            )

    def _adapter_shapes(self, lora: rollout_pb2.LoraAdapter) -> dict[str, list[int]]:
        if not self.max_lora_rank:
            raise FailedPrecondition(
                f"a LoRA adapter (rank {lora.rank}) came, but this rollout was started without LoRA support: "
                f"start it with rollout.max_lora_rank >= {lora.rank} (--max-lora-rank)"
            )
        if lora.rank > self.max_lora_rank:
            raise FailedPrecondition(
                f"LoraAdapter.rank {lora.rank} is above this rollout's rollout.max_lora_rank {self.max_lora_rank}: "
                f"start it with rollout.max_lora_rank >= {lora.rank} (--max-lora-rank)"
            )
        if lora.rank < 1:
            raise InvalidArgument("LoraAdapter.rank must be >= 1")
        if not (math.isfinite(lora.alpha) and lora.alpha > 0):
            raise InvalidArgument(f"LoraAdapter.alpha must be a positive number, got {lora.alpha}")
        if not lora.target_modules:
            raise InvalidArgument("LoraAdapter.target_modules is empty: name the modules the adapter wraps")
        if "all-linear" in lora.target_modules:  # peft's shorthand; its PeftModel's config holds what it meant
            raise InvalidArgument(
                "LoraAdapter.target_modules: send the module names peft resolved 'all-linear' to "
                "(peft_model.peft_config[adapter].target_modules), not the shorthand"
            )
        return adapter_shapes(self.modules, lora.rank, list(lora.target_modules))

    def receive(self, buckets) -> list[list]:
        """Take one SendWeights call's messages, (WeightBucket without data, data view); any bad one abandons
        the whole update. With several buckets, the checked refs [name, dtype, shape, offset] of this one,
        to load now; with one, [] (Finish loads)."""
        start = len(self.refs)
        if self.bucketed:  # this call's bucket stands alone
            self.data_bytes, self.cuda_ipc, self.source = 0, None, None
        try:
            for b, data in buckets:
                self._bucket(b, data)
            if not self.bucketed:
                return []
            refs = list(self.refs.values())[start:]
            self._check_data(refs)
            if self.keeping:
                return self.base.take(refs, self._read)
            if self.lora is not None:  # loaded whole at Finish; the next bucket reuses the space: copy out now
                self.adapter.update(self.read(refs))
                return []
            return [plain(r) for r in refs]
        except Exception:
            self._reset()
            raise

    def _bucket(self, b, data: memoryview) -> None:
        if not self.in_progress:
            raise FailedPrecondition("no weight update in progress: call BeginWeightUpdate first")
        if b.version != self.version:
            raise InvalidArgument(f"bucket for version {b.version}, but version {self.version} is being received")
        for ref in b.refs:
            self._ref(ref)
        if b.cuda_ipc_copies and not b.HasField("cuda_ipc"):
            raise InvalidArgument("WeightBucket.cuda_ipc_copies without WeightBucket.cuda_ipc")
        if b.HasField("cuda_ipc"):
            self.transport.handle(self, b)
        if b.shm_source:
            self.transport.source(self, b.shm_source, b.shm_source_nonce)
        if len(data):
            self.transport.data(self, b, data)

    def _ref(self, ref) -> None:
        """A tensor of the bucket, checked against what the update holds, then counted."""
        if ref.name in self.skip:
            return
        if ref.name not in self.expected:
            if self.lora is not None:
                raise InvalidArgument(
                    f"tensor {ref.name!r} is not in this adapter: LoraAdapter.target_modules of this model "
                    f"have peft's names, e.g. {next(iter(self.expected))!r}"
                )
            raise InvalidArgument(f"tensor {ref.name!r} is not a parameter of this model")
        if list(ref.shape) != self.expected[ref.name]:
            raise InvalidArgument(
                f"tensor {ref.name!r} has shape {list(ref.shape)}, the model's is {self.expected[ref.name]}"
            )
        if not ref_dtype(ref).is_floating_point:
            raise InvalidArgument(f"tensor {ref.name!r}: weights must be floating point")
        self._check_parts(ref)
        if ref.name in self.refs:
            raise InvalidArgument(f"tensor {ref.name!r} sent twice")
        self.received += wire_nbytes(ref)
        if self.received > self.total:
            raise InvalidArgument(f"tensors past the {self.total} announced bytes")
        self.refs[ref.name] = ref

    def _check_parts(self, ref) -> None:
        """Where the ref's bytes lie: inside the bucket; sent as changes only in a delta update."""
        if ref.delta != WHOLE and not self.delta:
            raise InvalidArgument(f"tensor {ref.name!r} is sent as changes in an update that is not a delta")
        numel, size = math.prod(ref.shape), ref_dtype(ref).itemsize
        if ref.delta == SPARSE and not 0 < ref.count <= numel:
            raise InvalidArgument(f"tensor {ref.name!r}: {ref.count} changed elements of {numel}")
        parts = {WHOLE: [(ref.offset, numel * size)], SAME: []}.get(
            ref.delta, [(ref.offset, ref.count * size), (ref.index_offset, ref.count * index_dtype(numel).itemsize)]
        )
        if any(offset + n > self.bucket_bytes for offset, n in parts):
            raise InvalidArgument(f"tensor {ref.name!r} runs past the bucket's {self.bucket_bytes} bytes")

    def _read(self, dtype: torch.dtype, shape: list[int], offset: int) -> torch.Tensor:
        """A view of the current bucket's bytes (shm, stream)."""
        seg = self.source or self.segment
        assert seg is not None  # staged at Begin
        return seg.tensor(dtype, shape, offset)

    def open_source(self, name: str, nonce: bytes) -> None:
        """shm: the bucket lies in another replica's segment, sealed by it for this update."""
        if self.source is not None and self.source.name != name:
            raise InvalidArgument(f"one bucket in two segments: {self.source.name!r} and {name[:100]!r}")
        try:
            seg = open_sealed(name, nonce)  # a replica's segment, sealed by it for this update
        except ValueError as e:
            raise InvalidArgument(f"WeightBucket.shm_source refused: {e}") from None
        if seg.size < self.bucket_bytes:
            raise InvalidArgument(f"shm_source {name!r} holds {seg.size} bytes, under a bucket's {self.bucket_bytes}")
        self.source = seg

    @property
    def staging(self) -> str:
        """The segment the current bucket is loaded from (shm, stream): the base where one is kept."""
        if self.keeping:
            return self.base.name
        seg = self.source or self.segment
        return seg.name if seg is not None else ""

    def _check_data(self, refs: list) -> None:
        """What the bucket (or the whole update) needs before it is loaded."""
        self.transport.complete(self, refs)

    def finish(self, version: int) -> Finished:
        """What is left to load; the update is over either way."""
        try:
            if not self.in_progress:
                raise FailedPrecondition("no weight update in progress")
            if version != self.version:
                raise InvalidArgument(f"finishing version {version}, but version {self.version} is being received")
            missing = sorted(set(self.expected) - set(self.refs))
            if missing:
                what = "adapter tensor" if self.lora is not None else "parameter"
                raise InvalidArgument(f"update incomplete: {len(missing)} {what}(s) missing, e.g. {missing[:3]}")
            refs = [] if self.bucketed else list(self.refs.values())  # several: each was taken as it came
            if not self.bucketed:
                self._check_data(refs)
            if self.keeping:
                loads = self.base.take(refs, self._read)
                self.base.version = version
                return Finished(loads, self.transport.name, None, None, len(self.expected), self.staging)
            if self.lora is not None:
                lora, tensors = self.lora, {**self.adapter, **self.read(refs)}
                adapter = Adapter(lora.rank, lora.alpha, list(lora.target_modules), tensors)
                return Finished([], self.transport.name, None, adapter, len(tensors))
            return Finished(
                [plain(r) for r in refs], self.transport.name, self.cuda_ipc, None, len(self.expected), self.staging
            )
        finally:
            self._reset()

    def read(self, refs: list) -> dict[str, torch.Tensor]:
        """CPU copies of the tensors of refs, out of the staging segment or the sender's CUDA bucket (both are
        reused for the next bucket or update)."""
        if not refs:
            return {}
        views = self.transport.views(self, refs, plain)
        return {name: t.to("cpu", copy=True) for name, t in views}

    def close(self) -> None:
        self.base.drop()
        if self.segment is not None:
            self.segment.unlink()
            self.segment = None


def plain(r) -> list:
    """A TensorRef as plain values, for the engine's workers (collective_rpc)."""
    return [r.name, str(ref_dtype(r)).removeprefix("torch."), list(r.shape), r.offset]
