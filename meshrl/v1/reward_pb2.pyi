from meshrl.v1 import common_pb2 as _common_pb2
from meshrl.v1 import data_pb2 as _data_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ScoreRequest(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: _data_pb2.DataProto
    def __init__(self, data: _Optional[_Union[_data_pb2.DataProto, _Mapping]] = ...) -> None: ...

class ScoreResponse(_message.Message):
    __slots__ = ("data", "metrics")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    DATA_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    data: _data_pb2.DataProto
    metrics: _containers.ScalarMap[str, float]
    def __init__(self, data: _Optional[_Union[_data_pb2.DataProto, _Mapping]] = ..., metrics: _Optional[_Mapping[str, float]] = ...) -> None: ...
