"""The protobuf wire format by hand: varints, tags, and a field scanner.

Only what the fast DataProto codec needs: writing a length-delimited field around
bytes we do not want protobuf to copy, and finding the spans of fields in a
received buffer so tensor bytes can be viewed in place. Malformed input raises
ValueError.
"""

from collections.abc import Iterator
from typing import NamedTuple

VARINT, I64, LEN, I32 = 0, 1, 2, 5


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def varint_size(n: int) -> int:
    return max(1, (n.bit_length() + 6) // 7)


def tag(field_number: int, wire_type: int) -> bytes:
    return varint(field_number << 3 | wire_type)


def len_prefix(field_number: int, length: int) -> bytes:
    """Tag and length of a length-delimited field whose payload has `length` bytes."""
    return tag(field_number, LEN) + varint(length)


def read_varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end:
            raise ValueError("malformed protobuf: truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise ValueError("malformed protobuf: varint longer than 10 bytes")


class Field(NamedTuple):
    number: int
    wire_type: int
    start: int  # where the tag starts (to copy the field verbatim)
    value_start: int  # for LEN fields: the payload; otherwise the raw value bytes
    end: int


def scan(buf: memoryview, start: int = 0, end: int | None = None) -> Iterator[Field]:
    """The top-level fields of the message in buf[start:end], in wire order."""
    end = len(buf) if end is None else end
    pos = start
    while pos < end:
        field_start = pos
        key, pos = read_varint(buf, pos, end)
        number, wire_type = key >> 3, key & 7
        if number == 0:
            raise ValueError("malformed protobuf: field number 0")
        if wire_type == VARINT:
            _, value_end = read_varint(buf, pos, end)
        elif wire_type == LEN:
            length, pos = read_varint(buf, pos, end)
            value_end = pos + length
        elif wire_type == I64:
            value_end = pos + 8
        elif wire_type == I32:
            value_end = pos + 4
        else:
            raise ValueError(f"malformed protobuf: unsupported wire type {wire_type} for field {number}")
        if value_end > end:
            raise ValueError(
                f"malformed protobuf: field {number} runs past the end of the message ({value_end} > {end}); truncated?"
            )
        yield Field(number, wire_type, field_start, pos, value_end)
        pos = value_end
