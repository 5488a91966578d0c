from meshrl.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Limits(_message.Message):
    __slots__ = ("wall_s", "cpu_s", "memory_mb", "processes", "file_mb", "disk_mb", "output_bytes")
    WALL_S_FIELD_NUMBER: _ClassVar[int]
    CPU_S_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MB_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    FILE_MB_FIELD_NUMBER: _ClassVar[int]
    DISK_MB_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_BYTES_FIELD_NUMBER: _ClassVar[int]
    wall_s: float
    cpu_s: float
    memory_mb: int
    processes: int
    file_mb: int
    disk_mb: int
    output_bytes: int
    def __init__(self, wall_s: _Optional[float] = ..., cpu_s: _Optional[float] = ..., memory_mb: _Optional[int] = ..., processes: _Optional[int] = ..., file_mb: _Optional[int] = ..., disk_mb: _Optional[int] = ..., output_bytes: _Optional[int] = ...) -> None: ...

class RunRequest(_message.Message):
    __slots__ = ("argv", "files", "stdin", "limits", "session", "return_files")
    class FilesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    ARGV_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    STDIN_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    RETURN_FILES_FIELD_NUMBER: _ClassVar[int]
    argv: _containers.RepeatedScalarFieldContainer[str]
    files: _containers.ScalarMap[str, bytes]
    stdin: bytes
    limits: Limits
    session: str
    return_files: bool
    def __init__(self, argv: _Optional[_Iterable[str]] = ..., files: _Optional[_Mapping[str, bytes]] = ..., stdin: _Optional[bytes] = ..., limits: _Optional[_Union[Limits, _Mapping]] = ..., session: _Optional[str] = ..., return_files: _Optional[bool] = ...) -> None: ...

class RunResponse(_message.Message):
    __slots__ = ("exit_code", "stdout", "stderr", "wall_s", "killed", "files", "truncated")
    class FilesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    STDOUT_FIELD_NUMBER: _ClassVar[int]
    STDERR_FIELD_NUMBER: _ClassVar[int]
    WALL_S_FIELD_NUMBER: _ClassVar[int]
    KILLED_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    exit_code: int
    stdout: bytes
    stderr: bytes
    wall_s: float
    killed: str
    files: _containers.ScalarMap[str, bytes]
    truncated: bool
    def __init__(self, exit_code: _Optional[int] = ..., stdout: _Optional[bytes] = ..., stderr: _Optional[bytes] = ..., wall_s: _Optional[float] = ..., killed: _Optional[str] = ..., files: _Optional[_Mapping[str, bytes]] = ..., truncated: _Optional[bool] = ...) -> None: ...

class CloseSessionRequest(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: str
    def __init__(self, session: _Optional[str] = ...) -> None: ...

class CloseSessionResponse(_message.Message):
    __slots__ = ("closed",)
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    closed: bool
    def __init__(self, closed: _Optional[bool] = ...) -> None: ...
