"""Weight handoff, the sender's side and the layout both sides share.

Parameters are laid out in one flat buffer, each at a 64-byte aligned offset
and described by a TensorRef (HF name, dtype, shape, offset). The sender
(the actor service, or anyone holding a state dict) pushes them to a rollout
service in three calls: BeginWeightUpdate, SendWeights (a stream), and
FinishWeightUpdate with the new version:

- shm: write the tensors straight into the /dev/shm segment Begin names (one
  copy), send only the refs;
- stream: send the flat buffer's bytes in chunks (for another host);
- cuda_ipc: share a CUDA bucket by IPC handle (same GPU).
"""

import time
from typing import Iterator

import torch

from meshrl.codec.dtypes import TO_TORCH, wire_dtype
from meshrl.codec.frame import tensor_bytes
from meshrl.codec.rawbytes import encode_bytes_field
from meshrl.shm import attach
from meshrl.v1 import rollout_pb2

ALIGN = 64
CHUNK_BYTES = 4 << 20
TRANSPORTS = ("shm", "stream", "cuda_ipc")


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def layout(named: dict[str, torch.Tensor]) -> tuple[list[rollout_pb2.TensorRef], int]:
    """Refs for each tensor in a flat buffer, and the buffer's size."""
    refs, offset = [], 0
    for name, t in named.items():
        refs.append(rollout_pb2.TensorRef(name=name, dtype=wire_dtype(t.dtype, name), shape=list(t.shape),
                                          offset=offset))
        offset += -(-nbytes(t) // ALIGN) * ALIGN
    return refs, offset


def ref_dtype(ref: rollout_pb2.TensorRef) -> torch.dtype:
    if ref.dtype not in TO_TORCH:
        raise ValueError(f"tensor {ref.name!r}: unknown dtype {ref.dtype}")
    return TO_TORCH[ref.dtype]


def ref_nbytes(ref: rollout_pb2.TensorRef) -> int:
    n = 1
    for d in ref.shape:
        n *= d
    return n * torch.empty((), dtype=ref_dtype(ref)).element_size()


def stream_chunks(named: dict[str, torch.Tensor], refs, total: int,
                  chunk: int = CHUNK_BYTES) -> Iterator[tuple[int, list[memoryview]]]:
    """(offset, pieces) of the flat buffer, about `chunk` bytes each (views of the tensors, not copies);
    padding between tensors is not sent."""
    pieces, size, start = [], 0, 0
    for (name, t), ref in zip(named.items(), refs):
        raw = tensor_bytes(t, name)
        pos = 0
        while pos < len(raw):
            if not pieces:
                start = ref.offset + pos
            take = min(len(raw) - pos, chunk - size)
            pieces.append(raw[pos:pos + take])
            size += take
            pos += take
            if size >= chunk or pos < len(raw):
                yield start, pieces
                pieces, size = [], 0
        if pieces:  # the next tensor starts after alignment padding: close this piece
            yield start, pieces
            pieces, size = [], 0


def push(client, named: dict[str, torch.Tensor], version: int, transport: str) -> dict[str, float]:
    """Send `named` (HF names) to the rollout service behind `client` (a meshrl.rpc.Client)."""
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {TRANSPORTS}, got {transport!r}")
    if transport == "cuda_ipc":
        from meshrl.cuda_ipc import push_cuda_ipc

        return push_cuda_ipc(client, named, version)
    start = time.perf_counter()
    refs, total = layout(named)
    begun = client.call("BeginWeightUpdate", rollout_pb2.BeginWeightUpdateRequest(
        version=version, transport=transport, total_bytes=total))
    if transport == "shm":
        seg = attach(begun.shm_segment)
        for (name, t), ref in zip(named.items(), refs):
            seg.tensor(t.dtype, list(t.shape), ref.offset).copy_(t.detach())
        buckets = iter([rollout_pb2.WeightBucket(version=version, refs=refs)])
    else:
        def gen():
            yield rollout_pb2.WeightBucket(version=version, refs=refs)
            for offset, pieces in stream_chunks(named, refs, total):
                yield encode_bytes_field(rollout_pb2.WeightBucket(version=version, data_offset=offset), "data", pieces)
        buckets = gen()
    client.call_stream("SendWeights", buckets)
    sent = time.perf_counter()
    client.call("FinishWeightUpdate", rollout_pb2.FinishWeightUpdateRequest(version=version))
    done = time.perf_counter()
    return {"num_bytes": float(sum(nbytes(t) for t in named.values())), "seconds": done - start,
            "transfer_seconds": sent - start, "load_seconds": done - sent}
