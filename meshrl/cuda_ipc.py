"""CUDA IPC weight handoff for services that share a GPU: hand over a handle, not the bytes.

The sender packs each bucket of parameters (meshrl.weights.plan) into one flat
CUDA buffer, kept and reused across buckets and pushes, shares it with torch's
CUDA IPC (cudaIpcGetMemHandle under the hood), and sends the handle's fields in
protobuf: no pickle. The receiver (the vLLM worker on the same GPU) opens the
handle, views the tensors in place and loads them before its SendWeights call
returns, so the next bucket may overwrite the buffer. Needs a GPU; tests skip
it elsewhere.

A sender on several GPUs (an actor with a rank per GPU) shares one copy of the
bucket per GPU; each receiving process takes the copy on its own GPU (as verl's
hybrid engine hands over per device), else the first. Handles name their GPU by
UUID, since two services may number the same GPUs differently.
"""

import torch

from meshrl.v1 import rollout_pb2

_buffers: dict[torch.device, torch.Tensor] = {}  # one reusable buffer per device


class CudaBucket:
    """The sender's staging buffer on the current GPU, at least `size` bytes."""

    def __init__(self, size: int):
        self.device = torch.device("cuda", torch.cuda.current_device())
        flat = _buffers.get(self.device)
        if flat is None or flat.numel() < size:
            _buffers.pop(self.device, None)  # free the old one before taking a bigger one
            flat = _buffers[self.device] = torch.empty(size, dtype=torch.uint8, device=self.device)
        self.flat = flat
        self.handle = share(flat.untyped_storage())

    def fill(self, tensors: list[torch.Tensor], bucket) -> rollout_pb2.CudaIpcHandle:
        """Copy a bucket's tensors in at their refs' offsets (on the device when they are there); the
        handle to send. Synchronized: the receiver reads it from another process."""
        for t, ref in zip(tensors, bucket.refs):
            n = t.numel() * t.element_size()
            self.flat[ref.offset : ref.offset + n].copy_(t.detach().reshape(-1).view(torch.uint8), non_blocking=True)
        torch.cuda.synchronize(self.device)
        return self.handle


def device_uuid(index: int) -> str:
    return str(torch.cuda.get_device_properties(index).uuid)


def share(storage: torch.UntypedStorage) -> rollout_pb2.CudaIpcHandle:
    (device, handle, size, offset, ref_handle, ref_offset, event_handle, event_sync) = storage._share_cuda_()
    return rollout_pb2.CudaIpcHandle(
        device=device,
        handle=handle,
        storage_size_bytes=size,
        storage_offset_bytes=offset,
        ref_counter_handle=ref_handle,
        ref_counter_offset=ref_offset,
        event_handle=event_handle or b"",
        event_sync_required=event_sync,
        device_uuid=device_uuid(device),
    )


def handle_fields(h: rollout_pb2.CudaIpcHandle) -> list:
    """Plain values (for vLLM's collective_rpc) from the protobuf handle: [GPU UUID, torch's fields]."""
    return [
        h.device_uuid,
        [
            h.device,
            h.handle,
            h.storage_size_bytes,
            h.storage_offset_bytes,
            h.ref_counter_handle,
            h.ref_counter_offset,
            h.event_handle or None,
            h.event_sync_required,
        ],
    ]


def pick(copies: list[list], here: dict[str, int], mine: str) -> list:
    """Of a bucket's copies ([UUID, fields] each, one per sender GPU), torch's fields of the one on this
    process's GPU (UUID `mine`), else of the first, with the device index as this process numbers it
    (`here`: UUID -> index). A handle without a UUID keeps its index."""
    uuid, fields = next((c for c in copies if c[0] and c[0] == mine), copies[0])
    if not uuid:
        return fields
    if uuid not in here:
        raise ValueError(
            f"the sender's GPU {uuid} is not visible to this process (CUDA_VISIBLE_DEVICES): "
            "cuda_ipc needs the sender's GPUs visible here; use shm or stream"
        )
    return [here[uuid], *fields[1:]]


def open_copy(copies: list[list]) -> torch.UntypedStorage:
    """The bucket's storage, from the copy on this process's current GPU where there is one."""
    torch.cuda._lazy_init()
    here = {device_uuid(i): i for i in range(torch.cuda.device_count())}
    return torch.UntypedStorage._new_shared_cuda(*pick(copies, here, device_uuid(torch.cuda.current_device())))


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
        out.append((name, flat[offset : offset + size].view(dt).view(shape)))
    return out
