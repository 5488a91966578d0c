"""The wire dtypes (meshrl.v1.DType) and their torch counterparts."""

import torch

from meshrl.v1 import data_pb2 as pb

TO_TORCH: dict[pb.DType, torch.dtype] = {
    pb.FLOAT32: torch.float32,
    pb.FLOAT16: torch.float16,
    pb.BFLOAT16: torch.bfloat16,
    pb.INT64: torch.int64,
    pb.INT32: torch.int32,
    pb.INT8: torch.int8,
    pb.UINT8: torch.uint8,
    pb.BOOL: torch.bool,
    pb.FLOAT64: torch.float64,
}
TO_WIRE: dict[torch.dtype, pb.DType] = {v: k for k, v in TO_TORCH.items()}


def wire_dtype(dtype: torch.dtype, name: str) -> pb.DType:
    """The DType for a torch dtype; ValueError naming the tensor if the wire has none."""
    try:
        return TO_WIRE[dtype]
    except KeyError:
        supported = ", ".join(str(d).removeprefix("torch.") for d in TO_WIRE)
        raise ValueError(f"tensor {name!r}: dtype {dtype} cannot travel; supported: {supported}") from None


def torch_dtype(dtype: pb.DType, name: str) -> torch.dtype:
    try:
        return TO_TORCH[dtype]
    except KeyError:
        raise ValueError(f"tensor {name!r}: unknown dtype {dtype}") from None
