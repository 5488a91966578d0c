"""CUDA IPC weight handoff for services that share a GPU: hand over a handle, not the bytes.

The sender packs the parameters into one flat CUDA bucket (kept and reused
across pushes), shares it with torch's CUDA IPC (cudaIpcGetMemHandle under the
hood), and sends the handle's fields in protobuf: no pickle. The receiver (the
vLLM worker on the same GPU) opens the handle, views the tensors in place and
loads them. Needs a GPU; tests skip it elsewhere.
"""

import time

import torch

from meshrl.v1 import rollout_pb2
from meshrl.weights import layout, nbytes

_buckets: dict[torch.device, torch.Tensor] = {}  # one reusable bucket per device


def bucket(device: torch.device, size: int) -> torch.Tensor:
    b = _buckets.get(device)
    if b is None or b.numel() < size:
        b = _buckets[device] = torch.empty(size, dtype=torch.uint8, device=device)
    return b


def share(storage: torch.UntypedStorage) -> rollout_pb2.CudaIpcHandle:
    (device, handle, size, offset, ref_handle, ref_offset, event_handle, event_sync) = storage._share_cuda_()
    return rollout_pb2.CudaIpcHandle(
        device=device, handle=handle, storage_size_bytes=size, storage_offset_bytes=offset,
        ref_counter_handle=ref_handle, ref_counter_offset=ref_offset, event_handle=event_handle or b"",
        event_sync_required=event_sync)


def handle_fields(h: rollout_pb2.CudaIpcHandle) -> list:
    """Plain values (for vLLM's collective_rpc) from the protobuf handle."""
    return [h.device, h.handle, h.storage_size_bytes, h.storage_offset_bytes, h.ref_counter_handle,
            h.ref_counter_offset, h.event_handle or None, h.event_sync_required]


def open_handle(fields: list) -> torch.UntypedStorage:
    torch.cuda._lazy_init()
    return torch.UntypedStorage._new_shared_cuda(*fields)


def views(storage: torch.UntypedStorage, refs: list[list]) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) for [name, dtype, shape, offset] refs into the shared storage, without copies."""
    flat = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
    out = []
    for name, dtype, shape, offset in refs:
        dt = getattr(torch, dtype)
        n = 1
        for d in shape:
            n *= d
        size = n * torch.empty((), dtype=dt).element_size()
        out.append((name, flat[offset:offset + size].view(dt).view(shape)))
    return out


def push_cuda_ipc(client, named: dict[str, torch.Tensor], version: int) -> dict[str, float]:
    start = time.perf_counter()
    device = next(iter(named.values())).device
    if device.type != "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    refs, total = layout(named)
    flat = bucket(device, total)
    for (name, t), ref in zip(named.items(), refs):
        flat[ref.offset:ref.offset + nbytes(t)].copy_(t.detach().reshape(-1).view(torch.uint8))
    torch.cuda.synchronize(device)
    client.call("BeginWeightUpdate", rollout_pb2.BeginWeightUpdateRequest(
        version=version, transport="cuda_ipc", total_bytes=total))
    client.call_stream("SendWeights", iter([rollout_pb2.WeightBucket(
        version=version, refs=refs, cuda_ipc=share(flat.untyped_storage()))]))
    client.call("FinishWeightUpdate", rollout_pb2.FinishWeightUpdateRequest(version=version))
    return {"num_bytes": float(sum(nbytes(t) for t in named.values())), "seconds": time.perf_counter() - start}
