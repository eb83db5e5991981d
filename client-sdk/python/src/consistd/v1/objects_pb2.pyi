from consistd.v1 import object_pb2 as _object_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReadSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    READ_SOURCE_UNSPECIFIED: _ClassVar[ReadSource]
    READ_SOURCE_CACHE: _ClassVar[ReadSource]
    READ_SOURCE_APISERVER: _ClassVar[ReadSource]

class PatchType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PATCH_TYPE_UNSPECIFIED: _ClassVar[PatchType]
    PATCH_TYPE_JSON: _ClassVar[PatchType]
    PATCH_TYPE_MERGE: _ClassVar[PatchType]
    PATCH_TYPE_STRATEGIC: _ClassVar[PatchType]
    PATCH_TYPE_APPLY: _ClassVar[PatchType]

class PropagationPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROPAGATION_POLICY_UNSPECIFIED: _ClassVar[PropagationPolicy]
    PROPAGATION_POLICY_ORPHAN: _ClassVar[PropagationPolicy]
    PROPAGATION_POLICY_BACKGROUND: _ClassVar[PropagationPolicy]
    PROPAGATION_POLICY_FOREGROUND: _ClassVar[PropagationPolicy]

class ConditionStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONDITION_STATUS_UNSPECIFIED: _ClassVar[ConditionStatus]
    CONDITION_STATUS_TRUE: _ClassVar[ConditionStatus]
    CONDITION_STATUS_FALSE: _ClassVar[ConditionStatus]
    CONDITION_STATUS_UNKNOWN: _ClassVar[ConditionStatus]

class EventSeverity(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EVENT_SEVERITY_UNSPECIFIED: _ClassVar[EventSeverity]
    EVENT_SEVERITY_NORMAL: _ClassVar[EventSeverity]
    EVENT_SEVERITY_WARNING: _ClassVar[EventSeverity]
READ_SOURCE_UNSPECIFIED: ReadSource
READ_SOURCE_CACHE: ReadSource
READ_SOURCE_APISERVER: ReadSource
PATCH_TYPE_UNSPECIFIED: PatchType
PATCH_TYPE_JSON: PatchType
PATCH_TYPE_MERGE: PatchType
PATCH_TYPE_STRATEGIC: PatchType
PATCH_TYPE_APPLY: PatchType
PROPAGATION_POLICY_UNSPECIFIED: PropagationPolicy
PROPAGATION_POLICY_ORPHAN: PropagationPolicy
PROPAGATION_POLICY_BACKGROUND: PropagationPolicy
PROPAGATION_POLICY_FOREGROUND: PropagationPolicy
CONDITION_STATUS_UNSPECIFIED: ConditionStatus
CONDITION_STATUS_TRUE: ConditionStatus
CONDITION_STATUS_FALSE: ConditionStatus
CONDITION_STATUS_UNKNOWN: ConditionStatus
EVENT_SEVERITY_UNSPECIFIED: EventSeverity
EVENT_SEVERITY_NORMAL: EventSeverity
EVENT_SEVERITY_WARNING: EventSeverity

class GetRequest(_message.Message):
    __slots__ = ("resource", "namespace", "name", "read_your_writes")
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    READ_YOUR_WRITES_FIELD_NUMBER: _ClassVar[int]
    resource: str
    namespace: str
    name: str
    read_your_writes: bool
    def __init__(self, resource: _Optional[str] = ..., namespace: _Optional[str] = ..., name: _Optional[str] = ..., read_your_writes: _Optional[bool] = ...) -> None: ...

class GetResponse(_message.Message):
    __slots__ = ("object", "source")
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    object: _object_pb2.KubeObject
    source: ReadSource
    def __init__(self, object: _Optional[_Union[_object_pb2.KubeObject, _Mapping]] = ..., source: _Optional[_Union[ReadSource, str]] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ("resource", "namespace", "label_selector", "field_selector", "read_your_writes")
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    LABEL_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    FIELD_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    READ_YOUR_WRITES_FIELD_NUMBER: _ClassVar[int]
    resource: str
    namespace: str
    label_selector: str
    field_selector: str
    read_your_writes: bool
    def __init__(self, resource: _Optional[str] = ..., namespace: _Optional[str] = ..., label_selector: _Optional[str] = ..., field_selector: _Optional[str] = ..., read_your_writes: _Optional[bool] = ...) -> None: ...

class ListResponse(_message.Message):
    __slots__ = ("objects", "resource_version", "source")
    OBJECTS_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    objects: _containers.RepeatedCompositeFieldContainer[_object_pb2.KubeObject]
    resource_version: str
    source: ReadSource
    def __init__(self, objects: _Optional[_Iterable[_Union[_object_pb2.KubeObject, _Mapping]]] = ..., resource_version: _Optional[str] = ..., source: _Optional[_Union[ReadSource, str]] = ...) -> None: ...

class CreateRequest(_message.Message):
    __slots__ = ("resource", "namespace", "object", "field_manager", "guard", "reconcile_lease")
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    FIELD_MANAGER_FIELD_NUMBER: _ClassVar[int]
    GUARD_FIELD_NUMBER: _ClassVar[int]
    RECONCILE_LEASE_FIELD_NUMBER: _ClassVar[int]
    resource: str
    namespace: str
    object: bytes
    field_manager: str
    guard: _object_pb2.WriteGuard
    reconcile_lease: str
    def __init__(self, resource: _Optional[str] = ..., namespace: _Optional[str] = ..., object: _Optional[bytes] = ..., field_manager: _Optional[str] = ..., guard: _Optional[_Union[_object_pb2.WriteGuard, _Mapping]] = ..., reconcile_lease: _Optional[str] = ...) -> None: ...

class CreateResponse(_message.Message):
    __slots__ = ("object", "fence")
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    object: _object_pb2.KubeObject
    fence: _object_pb2.Fence
    def __init__(self, object: _Optional[_Union[_object_pb2.KubeObject, _Mapping]] = ..., fence: _Optional[_Union[_object_pb2.Fence, str]] = ...) -> None: ...

class UpdateRequest(_message.Message):
    __slots__ = ("resource", "namespace", "name", "object", "subresource", "field_manager", "guard", "reconcile_lease", "send_unchanged")
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    SUBRESOURCE_FIELD_NUMBER: _ClassVar[int]
    FIELD_MANAGER_FIELD_NUMBER: _ClassVar[int]
    GUARD_FIELD_NUMBER: _ClassVar[int]
    RECONCILE_LEASE_FIELD_NUMBER: _ClassVar[int]
    SEND_UNCHANGED_FIELD_NUMBER: _ClassVar[int]
    resource: str
    namespace: str
    name: str
    object: bytes
    subresource: str
    field_manager: str
    guard: _object_pb2.WriteGuard
    reconcile_lease: str
    send_unchanged: bool
    def __init__(self, resource: _Optional[str] = ..., namespace: _Optional[str] = ..., name: _Optional[str] = ..., object: _Optional[bytes] = ..., subresource: _Optional[str] = ..., field_manager: _Optional[str] = ..., guard: _Optional[_Union[_object_pb2.WriteGuard, _Mapping]] = ..., reconcile_lease: _Optional[str] = ..., send_unchanged: _Optional[bool] = ...) -> None: ...

class UpdateResponse(_message.Message):
    __slots__ = ("object", "fence", "unchanged")
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    UNCHANGED_FIELD_NUMBER: _ClassVar[int]
    object: _object_pb2.KubeObject
    fence: _object_pb2.Fence
    unchanged: bool
    def __init__(self, object: _Optional[_Union[_object_pb2.KubeObject, _Mapping]] = ..., fence: _Optional[_Union[_object_pb2.Fence, str]] = ..., unchanged: _Optional[bool] = ...) -> None: ...

class PatchRequest(_message.Message):
    __slots__ = ("resource", "namespace", "name", "patch_type", "patch", "subresource", "field_manager", "force", "guard", "reconcile_lease", "send_unchanged")
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATCH_TYPE_FIELD_NUMBER: _ClassVar[int]
    PATCH_FIELD_NUMBER: _ClassVar[int]
    SUBRESOURCE_FIELD_NUMBER: _ClassVar[int]
    FIELD_MANAGER_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    GUARD_FIELD_NUMBER: _ClassVar[int]
    RECONCILE_LEASE_FIELD_NUMBER: _ClassVar[int]
    SEND_UNCHANGED_FIELD_NUMBER: _ClassVar[int]
    resource: str
    namespace: str
    name: str
    patch_type: PatchType
    patch: bytes
    subresource: str
    field_manager: str
    force: bool
    guard: _object_pb2.WriteGuard
    reconcile_lease: str
    send_unchanged: bool
    def __init__(self, resource: _Optional[str] = ..., namespace: _Optional[str] = ..., name: _Optional[str] = ..., patch_type: _Optional[_Union[PatchType, str]] = ..., patch: _Optional[bytes] = ..., subresource: _Optional[str] = ..., field_manager: _Optional[str] = ..., force: _Optional[bool] = ..., guard: _Optional[_Union[_object_pb2.WriteGuard, _Mapping]] = ..., reconcile_lease: _Optional[str] = ..., send_unchanged: _Optional[bool] = ...) -> None: ...

class PatchResponse(_message.Message):
    __slots__ = ("object", "fence", "unchanged")
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    UNCHANGED_FIELD_NUMBER: _ClassVar[int]
    object: _object_pb2.KubeObject
    fence: _object_pb2.Fence
    unchanged: bool
    def __init__(self, object: _Optional[_Union[_object_pb2.KubeObject, _Mapping]] = ..., fence: _Optional[_Union[_object_pb2.Fence, str]] = ..., unchanged: _Optional[bool] = ...) -> None: ...

class DeleteRequest(_message.Message):
    __slots__ = ("resource", "namespace", "name", "precondition_uid", "precondition_resource_version", "propagation_policy", "guard", "reconcile_lease")
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PRECONDITION_UID_FIELD_NUMBER: _ClassVar[int]
    PRECONDITION_RESOURCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROPAGATION_POLICY_FIELD_NUMBER: _ClassVar[int]
    GUARD_FIELD_NUMBER: _ClassVar[int]
    RECONCILE_LEASE_FIELD_NUMBER: _ClassVar[int]
    resource: str
    namespace: str
    name: str
    precondition_uid: str
    precondition_resource_version: str
    propagation_policy: PropagationPolicy
    guard: _object_pb2.WriteGuard
    reconcile_lease: str
    def __init__(self, resource: _Optional[str] = ..., namespace: _Optional[str] = ..., name: _Optional[str] = ..., precondition_uid: _Optional[str] = ..., precondition_resource_version: _Optional[str] = ..., propagation_policy: _Optional[_Union[PropagationPolicy, str]] = ..., guard: _Optional[_Union[_object_pb2.WriteGuard, _Mapping]] = ..., reconcile_lease: _Optional[str] = ...) -> None: ...

class DeleteResponse(_message.Message):
    __slots__ = ("object", "fence")
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    object: _object_pb2.KubeObject
    fence: _object_pb2.Fence
    def __init__(self, object: _Optional[_Union[_object_pb2.KubeObject, _Mapping]] = ..., fence: _Optional[_Union[_object_pb2.Fence, str]] = ...) -> None: ...

class Condition(_message.Message):
    __slots__ = ("type", "status", "reason", "message", "observed_generation")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_GENERATION_FIELD_NUMBER: _ClassVar[int]
    type: str
    status: ConditionStatus
    reason: str
    message: str
    observed_generation: int
    def __init__(self, type: _Optional[str] = ..., status: _Optional[_Union[ConditionStatus, str]] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., observed_generation: _Optional[int] = ...) -> None: ...

class SetConditionRequest(_message.Message):
    __slots__ = ("resource", "namespace", "name", "condition", "field_manager", "guard", "reconcile_lease")
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    CONDITION_FIELD_NUMBER: _ClassVar[int]
    FIELD_MANAGER_FIELD_NUMBER: _ClassVar[int]
    GUARD_FIELD_NUMBER: _ClassVar[int]
    RECONCILE_LEASE_FIELD_NUMBER: _ClassVar[int]
    resource: str
    namespace: str
    name: str
    condition: Condition
    field_manager: str
    guard: _object_pb2.WriteGuard
    reconcile_lease: str
    def __init__(self, resource: _Optional[str] = ..., namespace: _Optional[str] = ..., name: _Optional[str] = ..., condition: _Optional[_Union[Condition, _Mapping]] = ..., field_manager: _Optional[str] = ..., guard: _Optional[_Union[_object_pb2.WriteGuard, _Mapping]] = ..., reconcile_lease: _Optional[str] = ...) -> None: ...

class SetConditionResponse(_message.Message):
    __slots__ = ("object", "changed", "last_transition_time", "fence")
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    LAST_TRANSITION_TIME_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    object: _object_pb2.KubeObject
    changed: bool
    last_transition_time: str
    fence: _object_pb2.Fence
    def __init__(self, object: _Optional[_Union[_object_pb2.KubeObject, _Mapping]] = ..., changed: _Optional[bool] = ..., last_transition_time: _Optional[str] = ..., fence: _Optional[_Union[_object_pb2.Fence, str]] = ...) -> None: ...

class RecordEventRequest(_message.Message):
    __slots__ = ("resource", "namespace", "name", "uid", "severity", "reason", "action", "note", "reporting_controller")
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    SEVERITY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    REPORTING_CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    resource: str
    namespace: str
    name: str
    uid: str
    severity: EventSeverity
    reason: str
    action: str
    note: str
    reporting_controller: str
    def __init__(self, resource: _Optional[str] = ..., namespace: _Optional[str] = ..., name: _Optional[str] = ..., uid: _Optional[str] = ..., severity: _Optional[_Union[EventSeverity, str]] = ..., reason: _Optional[str] = ..., action: _Optional[str] = ..., note: _Optional[str] = ..., reporting_controller: _Optional[str] = ...) -> None: ...

class RecordEventResponse(_message.Message):
    __slots__ = ("recorded",)
    RECORDED_FIELD_NUMBER: _ClassVar[int]
    recorded: bool
    def __init__(self, recorded: _Optional[bool] = ...) -> None: ...
