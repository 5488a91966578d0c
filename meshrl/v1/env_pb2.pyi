from meshrl.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class ResetRequest(_message.Message):
    __slots__ = ("task_json", "seed")
    TASK_JSON_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    task_json: str
    seed: int
    def __init__(self, task_json: _Optional[str] = ..., seed: _Optional[int] = ...) -> None: ...

class StepRequest(_message.Message):
    __slots__ = ("episode_id", "action", "tool_calls_json")
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_JSON_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    action: str
    tool_calls_json: str
    def __init__(self, episode_id: _Optional[str] = ..., action: _Optional[str] = ..., tool_calls_json: _Optional[str] = ...) -> None: ...

class EnvReply(_message.Message):
    __slots__ = ("episode_id", "observation", "reward", "done", "info_json", "tool_results")
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    INFO_JSON_FIELD_NUMBER: _ClassVar[int]
    TOOL_RESULTS_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    observation: str
    reward: float
    done: bool
    info_json: str
    tool_results: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, episode_id: _Optional[str] = ..., observation: _Optional[str] = ..., reward: _Optional[float] = ..., done: _Optional[bool] = ..., info_json: _Optional[str] = ..., tool_results: _Optional[_Iterable[str]] = ...) -> None: ...

class CloseRequest(_message.Message):
    __slots__ = ("episode_id",)
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    def __init__(self, episode_id: _Optional[str] = ...) -> None: ...

class CloseResponse(_message.Message):
    __slots__ = ("closed",)
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    closed: bool
    def __init__(self, closed: _Optional[bool] = ...) -> None: ...
