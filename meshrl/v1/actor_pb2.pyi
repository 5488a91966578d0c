from meshrl.v1 import common_pb2 as _common_pb2
from meshrl.v1 import data_pb2 as _data_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class InitRequest(_message.Message):
    __slots__ = ("model", "engine", "optim")
    class EngineEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: _data_pb2.Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[_data_pb2.Value, _Mapping]] = ...) -> None: ...
    class OptimEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: _data_pb2.Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[_data_pb2.Value, _Mapping]] = ...) -> None: ...
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    OPTIM_FIELD_NUMBER: _ClassVar[int]
    model: str
    engine: _containers.MessageMap[str, _data_pb2.Value]
    optim: _containers.MessageMap[str, _data_pb2.Value]
    def __init__(self, model: _Optional[str] = ..., engine: _Optional[_Mapping[str, _data_pb2.Value]] = ..., optim: _Optional[_Mapping[str, _data_pb2.Value]] = ...) -> None: ...

class BatchRequest(_message.Message):
    __slots__ = ("data", "step", "with_entropy", "temperature", "without_adapter")
    DATA_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    WITH_ENTROPY_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    WITHOUT_ADAPTER_FIELD_NUMBER: _ClassVar[int]
    data: _data_pb2.DataProto
    step: int
    with_entropy: bool
    temperature: float
    without_adapter: bool
    def __init__(self, data: _Optional[_Union[_data_pb2.DataProto, _Mapping]] = ..., step: _Optional[int] = ..., with_entropy: _Optional[bool] = ..., temperature: _Optional[float] = ..., without_adapter: _Optional[bool] = ...) -> None: ...

class BatchResponse(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: _data_pb2.DataProto
    def __init__(self, data: _Optional[_Union[_data_pb2.DataProto, _Mapping]] = ...) -> None: ...

class LossSpec(_message.Message):
    __slots__ = ("name", "params")
    class ParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: _data_pb2.Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[_data_pb2.Value, _Mapping]] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    name: str
    params: _containers.MessageMap[str, _data_pb2.Value]
    def __init__(self, name: _Optional[str] = ..., params: _Optional[_Mapping[str, _data_pb2.Value]] = ...) -> None: ...

class UpdateRequest(_message.Message):
    __slots__ = ("data", "loss", "step")
    DATA_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    data: _data_pb2.DataProto
    loss: LossSpec
    step: int
    def __init__(self, data: _Optional[_Union[_data_pb2.DataProto, _Mapping]] = ..., loss: _Optional[_Union[LossSpec, _Mapping]] = ..., step: _Optional[int] = ...) -> None: ...

class UpdateResponse(_message.Message):
    __slots__ = ("metrics", "step", "already_applied")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    METRICS_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    ALREADY_APPLIED_FIELD_NUMBER: _ClassVar[int]
    metrics: _containers.ScalarMap[str, float]
    step: int
    already_applied: bool
    def __init__(self, metrics: _Optional[_Mapping[str, float]] = ..., step: _Optional[int] = ..., already_applied: _Optional[bool] = ...) -> None: ...

class CheckpointRequest(_message.Message):
    __slots__ = ("path", "export_hf")
    PATH_FIELD_NUMBER: _ClassVar[int]
    EXPORT_HF_FIELD_NUMBER: _ClassVar[int]
    path: str
    export_hf: bool
    def __init__(self, path: _Optional[str] = ..., export_hf: _Optional[bool] = ...) -> None: ...

class CheckpointResponse(_message.Message):
    __slots__ = ("path", "step")
    PATH_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    path: str
    step: int
    def __init__(self, path: _Optional[str] = ..., step: _Optional[int] = ...) -> None: ...

class PushWeightsRequest(_message.Message):
    __slots__ = ("rollout_address", "transport", "version", "bucket_bytes", "dtype", "rollback", "merge_lora", "more_rollout_addresses", "relay", "delta")
    ROLLOUT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BUCKET_BYTES_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    ROLLBACK_FIELD_NUMBER: _ClassVar[int]
    MERGE_LORA_FIELD_NUMBER: _ClassVar[int]
    MORE_ROLLOUT_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    RELAY_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    rollout_address: str
    transport: str
    version: int
    bucket_bytes: int
    dtype: str
    rollback: bool
    merge_lora: bool
    more_rollout_addresses: _containers.RepeatedScalarFieldContainer[str]
    relay: bool
    delta: bool
    def __init__(self, rollout_address: _Optional[str] = ..., transport: _Optional[str] = ..., version: _Optional[int] = ..., bucket_bytes: _Optional[int] = ..., dtype: _Optional[str] = ..., rollback: _Optional[bool] = ..., merge_lora: _Optional[bool] = ..., more_rollout_addresses: _Optional[_Iterable[str]] = ..., relay: _Optional[bool] = ..., delta: _Optional[bool] = ...) -> None: ...

class PushFailure(_message.Message):
    __slots__ = ("address", "code", "details")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    address: str
    code: str
    details: str
    def __init__(self, address: _Optional[str] = ..., code: _Optional[str] = ..., details: _Optional[str] = ...) -> None: ...

class PushWeightsResponse(_message.Message):
    __slots__ = ("version", "num_bytes", "seconds", "failed", "sent_bytes", "delta")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NUM_BYTES_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    SENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    version: int
    num_bytes: int
    seconds: float
    failed: _containers.RepeatedCompositeFieldContainer[PushFailure]
    sent_bytes: int
    delta: bool
    def __init__(self, version: _Optional[int] = ..., num_bytes: _Optional[int] = ..., seconds: _Optional[float] = ..., failed: _Optional[_Iterable[_Union[PushFailure, _Mapping]]] = ..., sent_bytes: _Optional[int] = ..., delta: _Optional[bool] = ...) -> None: ...

class OffloadRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class OffloadResponse(_message.Message):
    __slots__ = ("device",)
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    device: str
    def __init__(self, device: _Optional[str] = ...) -> None: ...
