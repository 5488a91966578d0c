"""Length-prefixed meshrl.v1.Value frames over a pipe: how the pool and its workers talk.

JSON-like values (ints kept apart from floats, bytes allowed) as protobuf; no pickle.
"""

import os
import struct
from typing import Any

from meshrl.codec.values import from_value, to_value
from meshrl.v1 import data_pb2 as pb

_HEADER = struct.Struct("<I")


def write_frame(fd: int, value: Any) -> None:
    body = to_value(value, "frame").SerializeToString()
    data = memoryview(_HEADER.pack(len(body)) + body)
    while data:
        data = data[os.write(fd, data):]


def _read_exactly(fd: int, n: int) -> bytes | None:
    chunks = []
    while n:
        chunk = os.read(fd, n)
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int) -> Any | None:
    """The next value, or None at end of file (the other side is gone)."""
    header = _read_exactly(fd, _HEADER.size)
    if header is None:
        return None
    body = _read_exactly(fd, _HEADER.unpack(header)[0])
    if body is None:
        return None
    return from_value(pb.Value.FromString(body), "frame")
