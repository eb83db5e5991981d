import datetime

from consistd.v1 import object_pb2 as _object_pb2
from consistd.v1 import refusal_pb2 as _refusal_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReceiveRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InboxMessage(_message.Message):
    __slots__ = ("message_id", "sender", "resource_id", "event_id", "payload", "content_type", "delivery_attempt", "received_at", "traceparent", "tracestate", "guard")
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_AT_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    TRACESTATE_FIELD_NUMBER: _ClassVar[int]
    GUARD_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    sender: str
    resource_id: str
    event_id: str
    payload: bytes
    content_type: str
    delivery_attempt: int
    received_at: _timestamp_pb2.Timestamp
    traceparent: str
    tracestate: str
    guard: _object_pb2.WriteGuard
    def __init__(self, message_id: _Optional[str] = ..., sender: _Optional[str] = ..., resource_id: _Optional[str] = ..., event_id: _Optional[str] = ..., payload: _Optional[bytes] = ..., content_type: _Optional[str] = ..., delivery_attempt: _Optional[int] = ..., received_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., traceparent: _Optional[str] = ..., tracestate: _Optional[str] = ..., guard: _Optional[_Union[_object_pb2.WriteGuard, _Mapping]] = ...) -> None: ...

class ReceiveResponse(_message.Message):
    __slots__ = ("message",)
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    message: InboxMessage
    def __init__(self, message: _Optional[_Union[InboxMessage, _Mapping]] = ...) -> None: ...

class AckRequest(_message.Message):
    __slots__ = ("message_id",)
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    def __init__(self, message_id: _Optional[str] = ...) -> None: ...

class AckResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AckStreamRequest(_message.Message):
    __slots__ = ("message_id",)
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    def __init__(self, message_id: _Optional[str] = ...) -> None: ...

class AckStreamResponse(_message.Message):
    __slots__ = ("message_id", "refusal")
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    REFUSAL_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    refusal: _refusal_pb2.Refusal
    def __init__(self, message_id: _Optional[str] = ..., refusal: _Optional[_Union[_refusal_pb2.Refusal, _Mapping]] = ...) -> None: ...

class NackRequest(_message.Message):
    __slots__ = ("message_id", "retry_after", "reason")
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    retry_after: _duration_pb2.Duration
    reason: str
    def __init__(self, message_id: _Optional[str] = ..., retry_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class NackResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
