"""The receiving side of a weight update: Begin, buckets, Finish; checked, then loaded all at once.

Every tensor must name a parameter of the model with its shape, each exactly
once; Finish loads only a complete, checked set, so a bad update leaves the
previous weights in use. The staging segment in /dev/shm is kept and reused
across updates (growing when needed).
"""

import logging
import math

import torch
from safetensors import safe_open

from meshrl.cuda_ipc import handle_fields
from meshrl.errors import FailedPrecondition, InvalidArgument, check_counter
from meshrl.shm import Segment
from meshrl.weights import ALIGN, TRANSPORTS, ref_dtype, ref_nbytes

log = logging.getLogger(__name__)


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


class WeightReceiver:
    def __init__(self, expected: dict[str, list[int]], tied_embeddings: bool):
        self.expected = expected
        # a tied lm_head is the embedding: senders may include it, the engine does not want it
        self.skip = {"lm_head.weight"} if tied_embeddings and "lm_head.weight" not in expected else set()
        # The most a sender may announce: every parameter (a tied head again) at 8 bytes an element, aligned.
        # More would commit /dev/shm on a caller's word (512 MiB once, for a 3M-parameter model).
        numel = sum(math.prod(shape) for shape in expected.values())
        self.max_bytes = (numel * (2 if self.skip else 1) * 8 + ALIGN * (len(expected) + 1)) or ALIGN
        self.segment: Segment | None = None
        self.version = 0  # the update in progress; 0 when none
        self._reset()

    def _reset(self) -> None:
        self.version, self.transport, self.total = 0, "", 0
        self.refs: dict = {}
        self.data_bytes = 0
        self.cuda_ipc: list | None = None  # the sender's bucket handle, for cuda_ipc

    @property
    def in_progress(self) -> bool:
        return self.version != 0

    def begin(self, version: int, transport: str, total_bytes: int, current: int) -> str:
        check_counter(version, "BeginWeightUpdateRequest.version")
        if version <= current:
            raise FailedPrecondition(f"weight version {version} is not newer than the version in use ({current})")
        if transport not in TRANSPORTS:
            raise InvalidArgument(f"transport must be one of {list(TRANSPORTS)}, got {transport!r}")
        if transport == "cuda_ipc" and not torch.cuda.is_available():
            raise InvalidArgument("cuda_ipc needs a GPU shared with the sender; use shm or stream")
        if not 0 < total_bytes <= self.max_bytes:
            raise InvalidArgument(f"total_bytes must be in 1..{self.max_bytes} (this model's weights at 8 bytes "
                                  f"an element), got {total_bytes}")
        if self.in_progress:
            log.warning("weight update %d abandoned for %d", self.version, version)
        self._reset()
        if transport != "cuda_ipc" and (self.segment is None or self.segment.size < total_bytes):  # reuse
            if self.segment is not None:
                self.segment.unlink()
            self.segment = Segment.create(total_bytes, prefix="meshrl-rollout")
        self.version, self.transport, self.total = version, transport, total_bytes
        return self.segment.name if transport != "cuda_ipc" else ""

    def receive(self, buckets) -> int:
        """Take a stream of (WeightBucket without data, data view); any bad one abandons the whole update."""
        try:
            for b, data in buckets:
                self._bucket(b, data)
        except Exception:
            self._reset()
            raise
        return len(self.refs)

    def _bucket(self, b, data: memoryview) -> None:
        if not self.in_progress:
            raise FailedPrecondition("no weight update in progress: call BeginWeightUpdate first")
        if b.version != self.version:
            raise InvalidArgument(f"bucket for version {b.version}, but version {self.version} is being received")
        for ref in b.refs:
            if ref.name in self.skip:
                continue
            if ref.name not in self.expected:
                raise InvalidArgument(f"tensor {ref.name!r} is not a parameter of this model")
            if list(ref.shape) != self.expected[ref.name]:
                raise InvalidArgument(f"tensor {ref.name!r} has shape {list(ref.shape)}, "
                                      f"the model's is {self.expected[ref.name]}")
            if not ref_dtype(ref).is_floating_point:
                raise InvalidArgument(f"tensor {ref.name!r}: weights must be floating point")
            if ref.offset + ref_nbytes(ref) > self.total:
                raise InvalidArgument(f"tensor {ref.name!r} runs past the {self.total} announced bytes")
            if ref.name in self.refs:
                raise InvalidArgument(f"tensor {ref.name!r} sent twice")
            self.refs[ref.name] = ref
        if b.HasField("cuda_ipc"):
            if self.transport != "cuda_ipc":
                raise InvalidArgument(f"a CUDA IPC handle came for the {self.transport} transport")
            self.cuda_ipc = handle_fields(b.cuda_ipc)
        if len(data):
            if self.transport != "stream":
                raise InvalidArgument(f"bucket data are for the stream transport, not {self.transport}")
            end = b.data_offset + len(data)
            if end > self.total:
                raise InvalidArgument(f"data at offset {b.data_offset} runs past the {self.total} announced bytes")
            self.segment.map[b.data_offset:end] = data
            self.data_bytes += len(data)

    def finish(self, version: int) -> tuple[list[list], str, list | None]:
        """(checked refs [name, dtype, shape, offset], transport, CUDA IPC handle fields or None);
        the update is over either way."""
        try:
            if not self.in_progress:
                raise FailedPrecondition("no weight update in progress")
            if version != self.version:
                raise InvalidArgument(f"finishing version {version}, but version {self.version} is being received")
            missing = sorted(set(self.expected) - set(self.refs))
            if missing:
                raise InvalidArgument(f"update incomplete: {len(missing)} parameter(s) missing, e.g. {missing[:3]}")
            need = sum(ref_nbytes(r) for r in self.refs.values())
            if self.transport == "stream" and self.data_bytes != need:
                raise InvalidArgument(f"update incomplete: {self.data_bytes} of {need} bytes received")
            if self.transport == "cuda_ipc" and self.cuda_ipc is None:
                raise InvalidArgument("update incomplete: no CUDA IPC handle received")
            refs = [[r.name, str(ref_dtype(r)).removeprefix("torch."), list(r.shape), r.offset]
                    for r in self.refs.values()]
            return refs, self.transport, self.cuda_ipc
        finally:
            self._reset()

    def close(self) -> None:
        if self.segment is not None:
            self.segment.unlink()
            self.segment = None
