"""The weight transports on the receiving side, one class each, as meshrl/weights.py has one sender class
each (SENDERS): what a bucket may carry on each (a CUDA IPC handle, another replica's shm segment, the
bytes themselves), what a bucket needs before it is loaded, and where its tensors are read from. The
receiver (services/rollout/weights.py) holds the update's state; a transport only checks and reads it."""

import torch

from meshrl import cuda_ipc
from meshrl.errors import InvalidArgument
from meshrl.weights import TRANSPORTS, ref_dtype, wire_nbytes


class Transport:
    """A bucket's parts that the transport does not carry are refused, naming it."""

    name = ""
    staged = True  # the bytes lie in a segment (ours or a replica's), sealed for the update

    def check(self) -> None:
        """What the transport needs of this machine (at Begin)."""

    def handle(self, receiver, b) -> None:
        raise InvalidArgument(f"a CUDA IPC handle came for the {self.name} transport")

    def source(self, receiver, name: str, nonce: bytes) -> None:
        raise InvalidArgument(f"WeightBucket.shm_source is for the shm transport, not {self.name}")

    def data(self, receiver, b, data: memoryview) -> None:
        raise InvalidArgument(f"bucket data are for the stream transport, not {self.name}")

    def complete(self, receiver, refs: list) -> None:
        """InvalidArgument when the bucket (or the whole update) lacks what its refs need."""

    def views(self, receiver, refs: list, plain) -> list[tuple[str, torch.Tensor]]:
        seg = receiver.source or receiver.segment
        assert seg is not None  # staged at Begin
        return [(r.name, seg.tensor(ref_dtype(r), list(r.shape), r.offset)) for r in refs]


class Shm(Transport):
    name = "shm"

    def source(self, receiver, name: str, nonce: bytes) -> None:
        receiver.open_source(name, nonce)


class Stream(Transport):
    name = "stream"

    def data(self, receiver, b, data: memoryview) -> None:
        end = b.data_offset + len(data)
        if end > receiver.bucket_bytes:
            raise InvalidArgument(
                f"data at offset {b.data_offset} runs past the bucket's {receiver.bucket_bytes} bytes"
            )
        seg = receiver.segment
        assert seg is not None and seg.map is not None  # staged at Begin, bucket_bytes (> 0) large
        seg.map[b.data_offset : end] = data
        receiver.data_bytes += len(data)

    def complete(self, receiver, refs: list) -> None:
        need = sum(wire_nbytes(r) for r in refs)
        if receiver.data_bytes != need:
            raise InvalidArgument(f"update incomplete: {receiver.data_bytes} of {need} bytes received")


class CudaIpc(Transport):
    name, staged = "cuda_ipc", False

    def check(self) -> None:
        if not torch.cuda.is_available():
            raise InvalidArgument("cuda_ipc needs a GPU shared with the sender; use shm or stream")

    def handle(self, receiver, b) -> None:
        receiver.cuda_ipc = [cuda_ipc.handle_fields(h) for h in (b.cuda_ipc, *b.cuda_ipc_copies)]

    def complete(self, receiver, refs: list) -> None:
        if receiver.cuda_ipc is None and refs:
            raise InvalidArgument("update incomplete: no CUDA IPC handle received")

    def views(self, receiver, refs: list, plain) -> list[tuple[str, torch.Tensor]]:
        assert receiver.cuda_ipc is not None  # complete() saw the handle
        return cuda_ipc.views(cuda_ipc.open_copy(receiver.cuda_ipc), [plain(r) for r in refs])


RECEIVERS: dict[str, Transport] = {t.name: t for t in (Shm(), Stream(), CudaIpc())}
assert RECEIVERS.keys() == set(TRANSPORTS)


def transport(name: str) -> Transport:
    if name not in RECEIVERS:
        raise InvalidArgument(f"transport must be one of {list(TRANSPORTS)}, got {name!r}")
    return RECEIVERS[name]
