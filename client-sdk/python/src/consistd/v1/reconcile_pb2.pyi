import datetime

from consistd.v1 import object_pb2 as _object_pb2
from consistd.v1 import refusal_pb2 as _refusal_pb2
from consistd.v1 import watch_pb2 as _watch_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ShardBy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SHARD_BY_UNSPECIFIED: _ClassVar[ShardBy]
    SHARD_BY_KEY: _ClassVar[ShardBy]
    SHARD_BY_NAMESPACE: _ClassVar[ShardBy]

class Outcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTCOME_UNSPECIFIED: _ClassVar[Outcome]
    OUTCOME_DONE: _ClassVar[Outcome]
    OUTCOME_REQUEUE: _ClassVar[Outcome]
    OUTCOME_RETRY: _ClassVar[Outcome]
    OUTCOME_TERMINAL: _ClassVar[Outcome]
SHARD_BY_UNSPECIFIED: ShardBy
SHARD_BY_KEY: ShardBy
SHARD_BY_NAMESPACE: ShardBy
OUTCOME_UNSPECIFIED: Outcome
OUTCOME_DONE: Outcome
OUTCOME_REQUEUE: Outcome
OUTCOME_RETRY: Outcome
OUTCOME_TERMINAL: Outcome

class ReconcileRequest(_message.Message):
    __slots__ = ("spec", "complete")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    spec: QueueSpec
    complete: Completion
    def __init__(self, spec: _Optional[_Union[QueueSpec, _Mapping]] = ..., complete: _Optional[_Union[Completion, _Mapping]] = ...) -> None: ...

class QueueSpec(_message.Message):
    __slots__ = ("name", "primary", "related", "max_leases", "retry", "lease_timeout", "election", "sharded", "shard_by", "finalizer")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PRIMARY_FIELD_NUMBER: _ClassVar[int]
    RELATED_FIELD_NUMBER: _ClassVar[int]
    MAX_LEASES_FIELD_NUMBER: _ClassVar[int]
    RETRY_FIELD_NUMBER: _ClassVar[int]
    LEASE_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    ELECTION_FIELD_NUMBER: _ClassVar[int]
    SHARDED_FIELD_NUMBER: _ClassVar[int]
    SHARD_BY_FIELD_NUMBER: _ClassVar[int]
    FINALIZER_FIELD_NUMBER: _ClassVar[int]
    name: str
    primary: ObjectQuery
    related: _containers.RepeatedCompositeFieldContainer[RelatedQuery]
    max_leases: int
    retry: RetryPolicy
    lease_timeout: _duration_pb2.Duration
    election: ElectionRef
    sharded: bool
    shard_by: ShardBy
    finalizer: str
    def __init__(self, name: _Optional[str] = ..., primary: _Optional[_Union[ObjectQuery, _Mapping]] = ..., related: _Optional[_Iterable[_Union[RelatedQuery, _Mapping]]] = ..., max_leases: _Optional[int] = ..., retry: _Optional[_Union[RetryPolicy, _Mapping]] = ..., lease_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., election: _Optional[_Union[ElectionRef, _Mapping]] = ..., sharded: _Optional[bool] = ..., shard_by: _Optional[_Union[ShardBy, str]] = ..., finalizer: _Optional[str] = ...) -> None: ...

class ObjectQuery(_message.Message):
    __slots__ = ("resource", "namespace", "label_selector", "field_selector", "view", "changes")
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    LABEL_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    FIELD_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    VIEW_FIELD_NUMBER: _ClassVar[int]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    resource: str
    namespace: str
    label_selector: str
    field_selector: str
    view: _object_pb2.ObjectView
    changes: ChangeFilter
    def __init__(self, resource: _Optional[str] = ..., namespace: _Optional[str] = ..., label_selector: _Optional[str] = ..., field_selector: _Optional[str] = ..., view: _Optional[_Union[_object_pb2.ObjectView, _Mapping]] = ..., changes: _Optional[_Union[ChangeFilter, _Mapping]] = ...) -> None: ...

class ChangeFilter(_message.Message):
    __slots__ = ("generation", "labels", "annotations")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    generation: bool
    labels: bool
    annotations: bool
    def __init__(self, generation: _Optional[bool] = ..., labels: _Optional[bool] = ..., annotations: _Optional[bool] = ...) -> None: ...

class RelatedQuery(_message.Message):
    __slots__ = ("query", "controller_owner", "label", "annotation", "field", "priority")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_OWNER_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    ANNOTATION_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    query: ObjectQuery
    controller_owner: bool
    label: str
    annotation: str
    field: str
    priority: int
    def __init__(self, query: _Optional[_Union[ObjectQuery, _Mapping]] = ..., controller_owner: _Optional[bool] = ..., label: _Optional[str] = ..., annotation: _Optional[str] = ..., field: _Optional[str] = ..., priority: _Optional[int] = ...) -> None: ...

class RetryPolicy(_message.Message):
    __slots__ = ("base_delay", "max_delay", "rate", "burst")
    BASE_DELAY_FIELD_NUMBER: _ClassVar[int]
    MAX_DELAY_FIELD_NUMBER: _ClassVar[int]
    RATE_FIELD_NUMBER: _ClassVar[int]
    BURST_FIELD_NUMBER: _ClassVar[int]
    base_delay: _duration_pb2.Duration
    max_delay: _duration_pb2.Duration
    rate: float
    burst: int
    def __init__(self, base_delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., max_delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., rate: _Optional[float] = ..., burst: _Optional[int] = ...) -> None: ...

class ElectionRef(_message.Message):
    __slots__ = ("election", "namespace")
    ELECTION_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    election: str
    namespace: str
    def __init__(self, election: _Optional[str] = ..., namespace: _Optional[str] = ...) -> None: ...

class Completion(_message.Message):
    __slots__ = ("lease_id", "outcome", "requeue_after", "error", "priority")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    REQUEUE_AFTER_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    outcome: Outcome
    requeue_after: _duration_pb2.Duration
    error: str
    priority: int
    def __init__(self, lease_id: _Optional[str] = ..., outcome: _Optional[_Union[Outcome, str]] = ..., requeue_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., error: _Optional[str] = ..., priority: _Optional[int] = ...) -> None: ...

class ReconcileResponse(_message.Message):
    __slots__ = ("started", "item", "refused")
    STARTED_FIELD_NUMBER: _ClassVar[int]
    ITEM_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    started: QueueStarted
    item: WorkItem
    refused: CompletionRefused
    def __init__(self, started: _Optional[_Union[QueueStarted, _Mapping]] = ..., item: _Optional[_Union[WorkItem, _Mapping]] = ..., refused: _Optional[_Union[CompletionRefused, _Mapping]] = ...) -> None: ...

class QueueStarted(_message.Message):
    __slots__ = ("name", "comparable_resource_versions")
    NAME_FIELD_NUMBER: _ClassVar[int]
    COMPARABLE_RESOURCE_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    comparable_resource_versions: bool
    def __init__(self, name: _Optional[str] = ..., comparable_resource_versions: _Optional[bool] = ...) -> None: ...

class WorkItem(_message.Message):
    __slots__ = ("lease_id", "namespace", "name", "object", "deleted", "consistency", "attempt", "term", "expires_at", "last_error", "finalizing")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    FINALIZING_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    namespace: str
    name: str
    object: _object_pb2.KubeObject
    deleted: bool
    consistency: _watch_pb2.Consistency
    attempt: int
    term: int
    expires_at: _timestamp_pb2.Timestamp
    last_error: str
    finalizing: bool
    def __init__(self, lease_id: _Optional[str] = ..., namespace: _Optional[str] = ..., name: _Optional[str] = ..., object: _Optional[_Union[_object_pb2.KubeObject, _Mapping]] = ..., deleted: _Optional[bool] = ..., consistency: _Optional[_Union[_watch_pb2.Consistency, str]] = ..., attempt: _Optional[int] = ..., term: _Optional[int] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_error: _Optional[str] = ..., finalizing: _Optional[bool] = ...) -> None: ...

class CompletionRefused(_message.Message):
    __slots__ = ("lease_id", "refusal")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    REFUSAL_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    refusal: _refusal_pb2.Refusal
    def __init__(self, lease_id: _Optional[str] = ..., refusal: _Optional[_Union[_refusal_pb2.Refusal, _Mapping]] = ...) -> None: ...
