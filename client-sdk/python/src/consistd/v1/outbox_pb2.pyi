import datetime

from consistd.v1 import object_pb2 as _object_pb2
from consistd.v1 import refusal_pb2 as _refusal_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AckOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACK_OUTCOME_UNSPECIFIED: _ClassVar[AckOutcome]
    ACK_OUTCOME_ACKED: _ClassVar[AckOutcome]
    ACK_OUTCOME_SUPERSEDED: _ClassVar[AckOutcome]
    ACK_OUTCOME_FAILED: _ClassVar[AckOutcome]
ACK_OUTCOME_UNSPECIFIED: AckOutcome
ACK_OUTCOME_ACKED: AckOutcome
ACK_OUTCOME_SUPERSEDED: AckOutcome
ACK_OUTCOME_FAILED: AckOutcome

class ServiceDestination(_message.Message):
    __slots__ = ("namespace", "name")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    name: str
    def __init__(self, namespace: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class Destination(_message.Message):
    __slots__ = ("peer", "service", "election")
    PEER_FIELD_NUMBER: _ClassVar[int]
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    ELECTION_FIELD_NUMBER: _ClassVar[int]
    peer: str
    service: ServiceDestination
    election: str
    def __init__(self, peer: _Optional[str] = ..., service: _Optional[_Union[ServiceDestination, _Mapping]] = ..., election: _Optional[str] = ...) -> None: ...

class SendRequest(_message.Message):
    __slots__ = ("destination", "resource_id", "event_id", "payload", "content_type", "traceparent", "tracestate", "guard")
    DESTINATION_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    TRACESTATE_FIELD_NUMBER: _ClassVar[int]
    GUARD_FIELD_NUMBER: _ClassVar[int]
    destination: Destination
    resource_id: str
    event_id: str
    payload: bytes
    content_type: str
    traceparent: str
    tracestate: str
    guard: _object_pb2.WriteGuard
    def __init__(self, destination: _Optional[_Union[Destination, _Mapping]] = ..., resource_id: _Optional[str] = ..., event_id: _Optional[str] = ..., payload: _Optional[bytes] = ..., content_type: _Optional[str] = ..., traceparent: _Optional[str] = ..., tracestate: _Optional[str] = ..., guard: _Optional[_Union[_object_pb2.WriteGuard, _Mapping]] = ...) -> None: ...

class SendResponse(_message.Message):
    __slots__ = ("message_id",)
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    def __init__(self, message_id: _Optional[str] = ...) -> None: ...

class SendStreamRequest(_message.Message):
    __slots__ = ("message",)
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    message: SendRequest
    def __init__(self, message: _Optional[_Union[SendRequest, _Mapping]] = ...) -> None: ...

class SendStreamResponse(_message.Message):
    __slots__ = ("message_id", "refusal")
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    REFUSAL_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    refusal: _refusal_pb2.Refusal
    def __init__(self, message_id: _Optional[str] = ..., refusal: _Optional[_Union[_refusal_pb2.Refusal, _Mapping]] = ...) -> None: ...

class WaitOutcomeRequest(_message.Message):
    __slots__ = ("message_id",)
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    def __init__(self, message_id: _Optional[str] = ...) -> None: ...

class WaitOutcomeResponse(_message.Message):
    __slots__ = ("outcome",)
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    outcome: WatchAcksResponse
    def __init__(self, outcome: _Optional[_Union[WatchAcksResponse, _Mapping]] = ...) -> None: ...

class WatchAcksRequest(_message.Message):
    __slots__ = ("resource_id",)
    RESOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    resource_id: str
    def __init__(self, resource_id: _Optional[str] = ...) -> None: ...

class WatchAcksResponse(_message.Message):
    __slots__ = ("message_id", "destination", "peer", "resource_id", "event_id", "outcome", "reason", "at")
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    destination: Destination
    peer: str
    resource_id: str
    event_id: str
    outcome: AckOutcome
    reason: str
    at: _timestamp_pb2.Timestamp
    def __init__(self, message_id: _Optional[str] = ..., destination: _Optional[_Union[Destination, _Mapping]] = ..., peer: _Optional[str] = ..., resource_id: _Optional[str] = ..., event_id: _Optional[str] = ..., outcome: _Optional[_Union[AckOutcome, str]] = ..., reason: _Optional[str] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class GetOutboxStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PendingMessage(_message.Message):
    __slots__ = ("message_id", "resource_id", "event_id", "attempts", "enqueued_at", "next_attempt_at", "last_error")
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    ENQUEUED_AT_FIELD_NUMBER: _ClassVar[int]
    NEXT_ATTEMPT_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    resource_id: str
    event_id: str
    attempts: int
    enqueued_at: _timestamp_pb2.Timestamp
    next_attempt_at: _timestamp_pb2.Timestamp
    last_error: str
    def __init__(self, message_id: _Optional[str] = ..., resource_id: _Optional[str] = ..., event_id: _Optional[str] = ..., attempts: _Optional[int] = ..., enqueued_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., next_attempt_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_error: _Optional[str] = ...) -> None: ...

class DestinationStatus(_message.Message):
    __slots__ = ("peer", "connected", "pending", "destination")
    PEER_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_FIELD_NUMBER: _ClassVar[int]
    peer: str
    connected: bool
    pending: _containers.RepeatedCompositeFieldContainer[PendingMessage]
    destination: Destination
    def __init__(self, peer: _Optional[str] = ..., connected: _Optional[bool] = ..., pending: _Optional[_Iterable[_Union[PendingMessage, _Mapping]]] = ..., destination: _Optional[_Union[Destination, _Mapping]] = ...) -> None: ...

class GetOutboxStatusResponse(_message.Message):
    __slots__ = ("destinations", "total_pending")
    DESTINATIONS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_PENDING_FIELD_NUMBER: _ClassVar[int]
    destinations: _containers.RepeatedCompositeFieldContainer[DestinationStatus]
    total_pending: int
    def __init__(self, destinations: _Optional[_Iterable[_Union[DestinationStatus, _Mapping]]] = ..., total_pending: _Optional[int] = ...) -> None: ...
