from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_UNSPECIFIED: _ClassVar[DType]
    FLOAT32: _ClassVar[DType]
    FLOAT16: _ClassVar[DType]
    BFLOAT16: _ClassVar[DType]
    INT64: _ClassVar[DType]
    INT32: _ClassVar[DType]
    INT8: _ClassVar[DType]
    UINT8: _ClassVar[DType]
    BOOL: _ClassVar[DType]
    FLOAT64: _ClassVar[DType]
DTYPE_UNSPECIFIED: DType
FLOAT32: DType
FLOAT16: DType
BFLOAT16: DType
INT64: DType
INT32: DType
INT8: DType
UINT8: DType
BOOL: DType
FLOAT64: DType

class Tensor(_message.Message):
    __slots__ = ("name", "dtype", "shape", "pad", "data")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    PAD_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    pad: bytes
    data: bytes
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[_Union[DType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., pad: _Optional[bytes] = ..., data: _Optional[bytes] = ...) -> None: ...

class Value(_message.Message):
    __slots__ = ("null_value", "bool_value", "int_value", "float_value", "string_value", "bytes_value", "list_value", "map_value")
    NULL_VALUE_FIELD_NUMBER: _ClassVar[int]
    BOOL_VALUE_FIELD_NUMBER: _ClassVar[int]
    INT_VALUE_FIELD_NUMBER: _ClassVar[int]
    FLOAT_VALUE_FIELD_NUMBER: _ClassVar[int]
    STRING_VALUE_FIELD_NUMBER: _ClassVar[int]
    BYTES_VALUE_FIELD_NUMBER: _ClassVar[int]
    LIST_VALUE_FIELD_NUMBER: _ClassVar[int]
    MAP_VALUE_FIELD_NUMBER: _ClassVar[int]
    null_value: bool
    bool_value: bool
    int_value: int
    float_value: float
    string_value: str
    bytes_value: bytes
    list_value: ListValue
    map_value: MapValue
    def __init__(self, null_value: _Optional[bool] = ..., bool_value: _Optional[bool] = ..., int_value: _Optional[int] = ..., float_value: _Optional[float] = ..., string_value: _Optional[str] = ..., bytes_value: _Optional[bytes] = ..., list_value: _Optional[_Union[ListValue, _Mapping]] = ..., map_value: _Optional[_Union[MapValue, _Mapping]] = ...) -> None: ...

class ListValue(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedCompositeFieldContainer[Value]
    def __init__(self, values: _Optional[_Iterable[_Union[Value, _Mapping]]] = ...) -> None: ...

class MapValue(_message.Message):
    __slots__ = ("fields",)
    class FieldsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    fields: _containers.MessageMap[str, Value]
    def __init__(self, fields: _Optional[_Mapping[str, Value]] = ...) -> None: ...

class Column(_message.Message):
    __slots__ = ("values", "strings", "ints", "floats", "bools")
    VALUES_FIELD_NUMBER: _ClassVar[int]
    STRINGS_FIELD_NUMBER: _ClassVar[int]
    INTS_FIELD_NUMBER: _ClassVar[int]
    FLOATS_FIELD_NUMBER: _ClassVar[int]
    BOOLS_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedCompositeFieldContainer[Value]
    strings: _containers.RepeatedScalarFieldContainer[str]
    ints: _containers.RepeatedScalarFieldContainer[int]
    floats: _containers.RepeatedScalarFieldContainer[float]
    bools: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, values: _Optional[_Iterable[_Union[Value, _Mapping]]] = ..., strings: _Optional[_Iterable[str]] = ..., ints: _Optional[_Iterable[int]] = ..., floats: _Optional[_Iterable[float]] = ..., bools: _Optional[_Iterable[bool]] = ...) -> None: ...

class DataProto(_message.Message):
    __slots__ = ("tensors", "non_tensors", "meta", "num_rows", "row_offset", "total_rows", "packing", "packed")
    class NonTensorsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Column
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Column, _Mapping]] = ...) -> None: ...
    class MetaEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    NON_TENSORS_FIELD_NUMBER: _ClassVar[int]
    META_FIELD_NUMBER: _ClassVar[int]
    NUM_ROWS_FIELD_NUMBER: _ClassVar[int]
    ROW_OFFSET_FIELD_NUMBER: _ClassVar[int]
    TOTAL_ROWS_FIELD_NUMBER: _ClassVar[int]
    PACKING_FIELD_NUMBER: _ClassVar[int]
    PACKED_FIELD_NUMBER: _ClassVar[int]
    tensors: _containers.RepeatedCompositeFieldContainer[Tensor]
    non_tensors: _containers.MessageMap[str, Column]
    meta: _containers.MessageMap[str, Value]
    num_rows: int
    row_offset: int
    total_rows: int
    packing: Packing
    packed: _containers.RepeatedCompositeFieldContainer[Tensor]
    def __init__(self, tensors: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., non_tensors: _Optional[_Mapping[str, Column]] = ..., meta: _Optional[_Mapping[str, Value]] = ..., num_rows: _Optional[int] = ..., row_offset: _Optional[int] = ..., total_rows: _Optional[int] = ..., packing: _Optional[_Union[Packing, _Mapping]] = ..., packed: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ...) -> None: ...

class Packing(_message.Message):
    __slots__ = ("prompt_width", "response_width", "pad", "layout", "ragged")
    class LayoutEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: DType
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[DType, str]] = ...) -> None: ...
    PROMPT_WIDTH_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_WIDTH_FIELD_NUMBER: _ClassVar[int]
    PAD_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    RAGGED_FIELD_NUMBER: _ClassVar[int]
    prompt_width: int
    response_width: int
    pad: int
    layout: _containers.ScalarMap[str, DType]
    ragged: _containers.RepeatedCompositeFieldContainer[Ragged]
    def __init__(self, prompt_width: _Optional[int] = ..., response_width: _Optional[int] = ..., pad: _Optional[int] = ..., layout: _Optional[_Mapping[str, DType]] = ..., ragged: _Optional[_Iterable[_Union[Ragged, _Mapping]]] = ...) -> None: ...

class Ragged(_message.Message):
    __slots__ = ("name", "dtype", "per_row")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    PER_ROW_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: DType
    per_row: bool
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[_Union[DType, str]] = ..., per_row: _Optional[bool] = ...) -> None: ...
