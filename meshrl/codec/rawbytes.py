"""A message with one large `bytes` field, written and read without protobuf copying the bytes.

protobuf copies a bytes field when the message is built, when it is
serialized, when it is parsed and when the field is read. For chunks of weights
(WeightBucket.data) this writes the other fields with protobuf and the bytes
around them by hand, and reads the bytes back as a memoryview of the received
buffer. The wire format is protobuf's own.
"""

from google.protobuf.message import Message

from meshrl.codec import protowire as w


def encode_bytes_field(msg: Message, field: str, pieces: list) -> bytes:
    """msg's bytes with `field` set to the concatenation of pieces (joined once, here)."""
    if getattr(msg, field):
        raise ValueError(f"{msg.DESCRIPTOR.full_name}.{field}: pass the bytes as pieces, not in the message")
    number = msg.DESCRIPTOR.fields_by_name[field].number
    size = sum(len(p) for p in pieces)
    return b"".join([msg.SerializeToString(), w.len_prefix(number, size), *pieces])


def decode_bytes_field(cls: type[Message], buf, field: str) -> tuple[Message, memoryview]:
    """(the message without `field`, a view of `field`'s bytes in buf)."""
    number = cls.DESCRIPTOR.fields_by_name[field].number
    mv = memoryview(buf)
    rest, data = [], mv[0:0]
    for f in w.scan(mv):
        if f.number == number and f.wire_type == w.LEN:
            data = mv[f.value_start : f.end]  # proto3 semantics: the last one wins
        else:
            rest.append(mv[f.start : f.end])
    return cls.FromString(b"".join(rest)), data
