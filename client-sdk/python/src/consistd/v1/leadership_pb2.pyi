import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LeadershipState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LEADERSHIP_STATE_UNSPECIFIED: _ClassVar[LeadershipState]
    LEADERSHIP_STATE_LEADER: _ClassVar[LeadershipState]
    LEADERSHIP_STATE_FOLLOWER: _ClassVar[LeadershipState]
    LEADERSHIP_STATE_UNKNOWN: _ClassVar[LeadershipState]
LEADERSHIP_STATE_UNSPECIFIED: LeadershipState
LEADERSHIP_STATE_LEADER: LeadershipState
LEADERSHIP_STATE_FOLLOWER: LeadershipState
LEADERSHIP_STATE_UNKNOWN: LeadershipState

class LeaseTiming(_message.Message):
    __slots__ = ("lease_duration", "renew_deadline", "retry_period")
    LEASE_DURATION_FIELD_NUMBER: _ClassVar[int]
    RENEW_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    RETRY_PERIOD_FIELD_NUMBER: _ClassVar[int]
    lease_duration: _duration_pb2.Duration
    renew_deadline: _duration_pb2.Duration
    retry_period: _duration_pb2.Duration
    def __init__(self, lease_duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., renew_deadline: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., retry_period: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class LeadershipStatus(_message.Message):
    __slots__ = ("election", "namespace", "state", "holder", "term", "timing", "acquired_at", "renewed_at", "observed_at", "identity", "leader_until")
    ELECTION_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    ACQUIRED_AT_FIELD_NUMBER: _ClassVar[int]
    RENEWED_AT_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_AT_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    LEADER_UNTIL_FIELD_NUMBER: _ClassVar[int]
    election: str
    namespace: str
    state: LeadershipState
    holder: str
    term: int
    timing: LeaseTiming
    acquired_at: _timestamp_pb2.Timestamp
    renewed_at: _timestamp_pb2.Timestamp
    observed_at: _timestamp_pb2.Timestamp
    identity: str
    leader_until: _timestamp_pb2.Timestamp
    def __init__(self, election: _Optional[str] = ..., namespace: _Optional[str] = ..., state: _Optional[_Union[LeadershipState, str]] = ..., holder: _Optional[str] = ..., term: _Optional[int] = ..., timing: _Optional[_Union[LeaseTiming, _Mapping]] = ..., acquired_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., renewed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., observed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., identity: _Optional[str] = ..., leader_until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class CampaignRequest(_message.Message):
    __slots__ = ("election", "namespace", "identity", "timing")
    ELECTION_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    election: str
    namespace: str
    identity: str
    timing: LeaseTiming
    def __init__(self, election: _Optional[str] = ..., namespace: _Optional[str] = ..., identity: _Optional[str] = ..., timing: _Optional[_Union[LeaseTiming, _Mapping]] = ...) -> None: ...

class CampaignResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: LeadershipStatus
    def __init__(self, status: _Optional[_Union[LeadershipStatus, _Mapping]] = ...) -> None: ...

class ObserveRequest(_message.Message):
    __slots__ = ("election", "namespace")
    ELECTION_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    election: str
    namespace: str
    def __init__(self, election: _Optional[str] = ..., namespace: _Optional[str] = ...) -> None: ...

class ObserveResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: LeadershipStatus
    def __init__(self, status: _Optional[_Union[LeadershipStatus, _Mapping]] = ...) -> None: ...

class GetLeadershipRequest(_message.Message):
    __slots__ = ("election", "namespace")
    ELECTION_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    election: str
    namespace: str
    def __init__(self, election: _Optional[str] = ..., namespace: _Optional[str] = ...) -> None: ...

class GetLeadershipResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: LeadershipStatus
    def __init__(self, status: _Optional[_Union[LeadershipStatus, _Mapping]] = ...) -> None: ...
