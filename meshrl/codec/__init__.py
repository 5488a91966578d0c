"""The wire codec: DataProto <-> protobuf bytes, fast and without pickle.

- dtypes: the DType enum <-> torch dtypes.
- values: per-row and meta values <-> meshrl.v1.Value (no torch needed).
- protowire: varints and field scanning, the protobuf wire format by hand.
- frame: DataProto <-> meshrl.v1.DataProto bytes, zero-copy on decode.
- payload: a request/response message with its DataProto, unary or as a row stream.
- packing: packed tensors, verl's padded layout written once unpadded and rebuilt exactly by the reader.
- rawbytes: a message with one large `bytes` field (weight buckets), without protobuf copying the bytes.

Names below are imported lazily, so `meshrl.codec.values` alone stays light.
"""

import importlib

_EXPORTS = {
    "decode_dataproto": "meshrl.codec.frame",
    "encode_dataproto": "meshrl.codec.frame",
    "from_proto": "meshrl.codec.frame",
    "to_proto": "meshrl.codec.frame",
    "Assembler": "meshrl.codec.payload",
    "Payload": "meshrl.codec.payload",
    "decode_message": "meshrl.codec.payload",
    "encode_message": "meshrl.codec.payload",
    "split_rows": "meshrl.codec.payload",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'meshrl.codec' has no attribute {name!r}")
