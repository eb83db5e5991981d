import datetime

from consistd.v1 import object_pb2 as _object_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PublishRequest(_message.Message):
    __slots__ = ("channel", "payload", "content_type", "guard")
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    GUARD_FIELD_NUMBER: _ClassVar[int]
    channel: str
    payload: bytes
    content_type: str
    guard: _object_pb2.WriteGuard
    def __init__(self, channel: _Optional[str] = ..., payload: _Optional[bytes] = ..., content_type: _Optional[str] = ..., guard: _Optional[_Union[_object_pb2.WriteGuard, _Mapping]] = ...) -> None: ...

class PublishResponse(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    def __init__(self, version: _Optional[int] = ...) -> None: ...

class SubscribeVersionsRequest(_message.Message):
    __slots__ = ("channel",)
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    channel: str
    def __init__(self, channel: _Optional[str] = ...) -> None: ...

class SubscribeVersionsResponse(_message.Message):
    __slots__ = ("channel", "version", "payload", "content_type", "published_at")
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_AT_FIELD_NUMBER: _ClassVar[int]
    channel: str
    version: int
    payload: bytes
    content_type: str
    published_at: _timestamp_pb2.Timestamp
    def __init__(self, channel: _Optional[str] = ..., version: _Optional[int] = ..., payload: _Optional[bytes] = ..., content_type: _Optional[str] = ..., published_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ReportAppliedRequest(_message.Message):
    __slots__ = ("channel", "version")
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    channel: str
    version: int
    def __init__(self, channel: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class ReportAppliedResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MemberStatus(_message.Message):
    __slots__ = ("member", "applied_version", "live", "last_seen")
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    APPLIED_VERSION_FIELD_NUMBER: _ClassVar[int]
    LIVE_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_FIELD_NUMBER: _ClassVar[int]
    member: str
    applied_version: int
    live: bool
    last_seen: _timestamp_pb2.Timestamp
    def __init__(self, member: _Optional[str] = ..., applied_version: _Optional[int] = ..., live: _Optional[bool] = ..., last_seen: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class GetRolloutStatusRequest(_message.Message):
    __slots__ = ("channel", "version")
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    channel: str
    version: int
    def __init__(self, channel: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class GetRolloutStatusResponse(_message.Message):
    __slots__ = ("channel", "version", "latest_version", "members", "all_applied")
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    LATEST_VERSION_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    ALL_APPLIED_FIELD_NUMBER: _ClassVar[int]
    channel: str
    version: int
    latest_version: int
    members: _containers.RepeatedCompositeFieldContainer[MemberStatus]
    all_applied: bool
    def __init__(self, channel: _Optional[str] = ..., version: _Optional[int] = ..., latest_version: _Optional[int] = ..., members: _Optional[_Iterable[_Union[MemberStatus, _Mapping]]] = ..., all_applied: _Optional[bool] = ...) -> None: ...

class WaitAppliedRequest(_message.Message):
    __slots__ = ("channel", "version", "timeout")
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    channel: str
    version: int
    timeout: _duration_pb2.Duration
    def __init__(self, channel: _Optional[str] = ..., version: _Optional[int] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class WaitAppliedResponse(_message.Message):
    __slots__ = ("all_applied", "members", "lagging")
    ALL_APPLIED_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    LAGGING_FIELD_NUMBER: _ClassVar[int]
    all_applied: bool
    members: _containers.RepeatedCompositeFieldContainer[MemberStatus]
    lagging: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, all_applied: _Optional[bool] = ..., members: _Optional[_Iterable[_Union[MemberStatus, _Mapping]]] = ..., lagging: _Optional[_Iterable[str]] = ...) -> None: ...
