from meshrl.v1 import common_pb2 as _common_pb2
from meshrl.v1 import data_pb2 as _data_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SamplingParams(_message.Message):
    __slots__ = ("n", "temperature", "top_p", "top_k", "max_new_tokens", "stop", "stop_token_ids", "seed", "logprobs", "greedy", "routed_experts")
    N_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    GREEDY_FIELD_NUMBER: _ClassVar[int]
    ROUTED_EXPERTS_FIELD_NUMBER: _ClassVar[int]
    n: int
    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    seed: int
    logprobs: bool
    greedy: bool
    routed_experts: bool
    def __init__(self, n: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., max_new_tokens: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., seed: _Optional[int] = ..., logprobs: _Optional[bool] = ..., greedy: _Optional[bool] = ..., routed_experts: _Optional[bool] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("data", "sampling")
    DATA_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    data: _data_pb2.DataProto
    sampling: SamplingParams
    def __init__(self, data: _Optional[_Union[_data_pb2.DataProto, _Mapping]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("data", "weight_version")
    DATA_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    data: _data_pb2.DataProto
    weight_version: int
    def __init__(self, data: _Optional[_Union[_data_pb2.DataProto, _Mapping]] = ..., weight_version: _Optional[int] = ...) -> None: ...

class BeginWeightUpdateRequest(_message.Message):
    __slots__ = ("version", "transport", "total_bytes", "bucket_bytes", "rollback", "lora", "keep_base", "delta_base")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    BUCKET_BYTES_FIELD_NUMBER: _ClassVar[int]
    ROLLBACK_FIELD_NUMBER: _ClassVar[int]
    LORA_FIELD_NUMBER: _ClassVar[int]
    KEEP_BASE_FIELD_NUMBER: _ClassVar[int]
    DELTA_BASE_FIELD_NUMBER: _ClassVar[int]
    version: int
    transport: str
    total_bytes: int
    bucket_bytes: int
    rollback: bool
    lora: LoraAdapter
    keep_base: bool
    delta_base: int
    def __init__(self, version: _Optional[int] = ..., transport: _Optional[str] = ..., total_bytes: _Optional[int] = ..., bucket_bytes: _Optional[int] = ..., rollback: _Optional[bool] = ..., lora: _Optional[_Union[LoraAdapter, _Mapping]] = ..., keep_base: _Optional[bool] = ..., delta_base: _Optional[int] = ...) -> None: ...

class LoraAdapter(_message.Message):
    __slots__ = ("rank", "alpha", "target_modules")
    RANK_FIELD_NUMBER: _ClassVar[int]
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    TARGET_MODULES_FIELD_NUMBER: _ClassVar[int]
    rank: int
    alpha: float
    target_modules: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, rank: _Optional[int] = ..., alpha: _Optional[float] = ..., target_modules: _Optional[_Iterable[str]] = ...) -> None: ...

class TensorRef(_message.Message):
    __slots__ = ("name", "dtype", "shape", "offset", "delta", "count", "index_offset", "checksum")
    class Delta(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        WHOLE: _ClassVar[TensorRef.Delta]
        SPARSE: _ClassVar[TensorRef.Delta]
        SAME: _ClassVar[TensorRef.Delta]
    WHOLE: TensorRef.Delta
    SPARSE: TensorRef.Delta
    SAME: TensorRef.Delta
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    INDEX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: _data_pb2.DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    offset: int
    delta: TensorRef.Delta
    count: int
    index_offset: int
    checksum: int
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[_Union[_data_pb2.DType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., offset: _Optional[int] = ..., delta: _Optional[_Union[TensorRef.Delta, str]] = ..., count: _Optional[int] = ..., index_offset: _Optional[int] = ..., checksum: _Optional[int] = ...) -> None: ...

class CudaIpcHandle(_message.Message):
    __slots__ = ("device", "handle", "storage_size_bytes", "storage_offset_bytes", "ref_counter_handle", "ref_counter_offset", "event_handle", "event_sync_required", "device_uuid")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    STORAGE_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    STORAGE_OFFSET_BYTES_FIELD_NUMBER: _ClassVar[int]
    REF_COUNTER_HANDLE_FIELD_NUMBER: _ClassVar[int]
    REF_COUNTER_OFFSET_FIELD_NUMBER: _ClassVar[int]
    EVENT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    EVENT_SYNC_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    DEVICE_UUID_FIELD_NUMBER: _ClassVar[int]
    device: int
    handle: bytes
    storage_size_bytes: int
    storage_offset_bytes: int
    ref_counter_handle: bytes
    ref_counter_offset: int
    event_handle: bytes
    event_sync_required: bool
    device_uuid: str
    def __init__(self, device: _Optional[int] = ..., handle: _Optional[bytes] = ..., storage_size_bytes: _Optional[int] = ..., storage_offset_bytes: _Optional[int] = ..., ref_counter_handle: _Optional[bytes] = ..., ref_counter_offset: _Optional[int] = ..., event_handle: _Optional[bytes] = ..., event_sync_required: _Optional[bool] = ..., device_uuid: _Optional[str] = ...) -> None: ...

class WeightBucket(_message.Message):
    __slots__ = ("version", "refs", "data_offset", "data", "cuda_ipc", "cuda_ipc_copies", "shm_source", "shm_source_nonce", "relay_to")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REFS_FIELD_NUMBER: _ClassVar[int]
    DATA_OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    CUDA_IPC_FIELD_NUMBER: _ClassVar[int]
    CUDA_IPC_COPIES_FIELD_NUMBER: _ClassVar[int]
    SHM_SOURCE_FIELD_NUMBER: _ClassVar[int]
    SHM_SOURCE_NONCE_FIELD_NUMBER: _ClassVar[int]
    RELAY_TO_FIELD_NUMBER: _ClassVar[int]
    version: int
    refs: _containers.RepeatedCompositeFieldContainer[TensorRef]
    data_offset: int
    data: bytes
    cuda_ipc: CudaIpcHandle
    cuda_ipc_copies: _containers.RepeatedCompositeFieldContainer[CudaIpcHandle]
    shm_source: str
    shm_source_nonce: bytes
    relay_to: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, version: _Optional[int] = ..., refs: _Optional[_Iterable[_Union[TensorRef, _Mapping]]] = ..., data_offset: _Optional[int] = ..., data: _Optional[bytes] = ..., cuda_ipc: _Optional[_Union[CudaIpcHandle, _Mapping]] = ..., cuda_ipc_copies: _Optional[_Iterable[_Union[CudaIpcHandle, _Mapping]]] = ..., shm_source: _Optional[str] = ..., shm_source_nonce: _Optional[bytes] = ..., relay_to: _Optional[_Iterable[str]] = ...) -> None: ...

class FinishWeightUpdateRequest(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    def __init__(self, version: _Optional[int] = ...) -> None: ...

class WeightUpdateStatus(_message.Message):
    __slots__ = ("version", "num_tensors", "num_bytes", "shm_segment", "in_progress", "shm_nonce", "relay_missed", "relay_error", "error_code", "error_details")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NUM_TENSORS_FIELD_NUMBER: _ClassVar[int]
    NUM_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHM_SEGMENT_FIELD_NUMBER: _ClassVar[int]
    IN_PROGRESS_FIELD_NUMBER: _ClassVar[int]
    SHM_NONCE_FIELD_NUMBER: _ClassVar[int]
    RELAY_MISSED_FIELD_NUMBER: _ClassVar[int]
    RELAY_ERROR_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_DETAILS_FIELD_NUMBER: _ClassVar[int]
    version: int
    num_tensors: int
    num_bytes: int
    shm_segment: str
    in_progress: bool
    shm_nonce: bytes
    relay_missed: _containers.RepeatedScalarFieldContainer[str]
    relay_error: str
    error_code: str
    error_details: str
    def __init__(self, version: _Optional[int] = ..., num_tensors: _Optional[int] = ..., num_bytes: _Optional[int] = ..., shm_segment: _Optional[str] = ..., in_progress: _Optional[bool] = ..., shm_nonce: _Optional[bytes] = ..., relay_missed: _Optional[_Iterable[str]] = ..., relay_error: _Optional[str] = ..., error_code: _Optional[str] = ..., error_details: _Optional[str] = ...) -> None: ...

class SleepRequest(_message.Message):
    __slots__ = ("level", "tags")
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    level: int
    tags: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, level: _Optional[int] = ..., tags: _Optional[_Iterable[str]] = ...) -> None: ...

class SleepResponse(_message.Message):
    __slots__ = ("sleeping", "asleep")
    SLEEPING_FIELD_NUMBER: _ClassVar[int]
    ASLEEP_FIELD_NUMBER: _ClassVar[int]
    sleeping: bool
    asleep: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, sleeping: _Optional[bool] = ..., asleep: _Optional[_Iterable[str]] = ...) -> None: ...
