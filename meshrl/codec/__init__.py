"""The wire codec: DataProto <-> protobuf bytes, fast and without pickle.

- dtypes: the DType enum <-> torch dtypes.
- values: per-row and meta values <-> meshrl.v1.Value.
- protowire: varints and field scanning, the protobuf wire format by hand.
- frame: DataProto <-> meshrl.v1.DataProto bytes, zero-copy on decode.
- payload: a request/response message with its DataProto, unary or as a row stream.
"""

from meshrl.codec.frame import decode_dataproto, encode_dataproto, from_proto, to_proto
from meshrl.codec.payload import Assembler, Payload, decode_message, encode_message, split_rows

__all__ = [
    "Assembler",
    "Payload",
    "decode_dataproto",
    "decode_message",
    "encode_dataproto",
    "encode_message",
    "from_proto",
    "split_rows",
    "to_proto",
]
