from consistd.v1 import object_pb2 as _object_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DeliveryMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DELIVERY_MODE_UNSPECIFIED: _ClassVar[DeliveryMode]
    DELIVERY_MODE_RAW: _ClassVar[DeliveryMode]
    DELIVERY_MODE_CONSISTENT: _ClassVar[DeliveryMode]

class EventType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EVENT_TYPE_UNSPECIFIED: _ClassVar[EventType]
    EVENT_TYPE_ADDED: _ClassVar[EventType]
    EVENT_TYPE_MODIFIED: _ClassVar[EventType]
    EVENT_TYPE_DELETED: _ClassVar[EventType]
    EVENT_TYPE_SYNCED: _ClassVar[EventType]
    EVENT_TYPE_RESYNC_REQUIRED: _ClassVar[EventType]

class Consistency(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONSISTENCY_UNSPECIFIED: _ClassVar[Consistency]
    CONSISTENCY_CONSISTENT: _ClassVar[Consistency]
    CONSISTENCY_AWAITING_OWN_WRITE: _ClassVar[Consistency]
    CONSISTENCY_OWN_WRITE: _ClassVar[Consistency]
    CONSISTENCY_TIMED_OUT: _ClassVar[Consistency]
DELIVERY_MODE_UNSPECIFIED: DeliveryMode
DELIVERY_MODE_RAW: DeliveryMode
DELIVERY_MODE_CONSISTENT: DeliveryMode
EVENT_TYPE_UNSPECIFIED: EventType
EVENT_TYPE_ADDED: EventType
EVENT_TYPE_MODIFIED: EventType
EVENT_TYPE_DELETED: EventType
EVENT_TYPE_SYNCED: EventType
EVENT_TYPE_RESYNC_REQUIRED: EventType
CONSISTENCY_UNSPECIFIED: Consistency
CONSISTENCY_CONSISTENT: Consistency
CONSISTENCY_AWAITING_OWN_WRITE: Consistency
CONSISTENCY_OWN_WRITE: Consistency
CONSISTENCY_TIMED_OUT: Consistency

class SubscribeRequest(_message.Message):
    __slots__ = ("resource", "namespace", "label_selector", "field_selector", "mode", "resume_cursor", "view")
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    LABEL_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    FIELD_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    RESUME_CURSOR_FIELD_NUMBER: _ClassVar[int]
    VIEW_FIELD_NUMBER: _ClassVar[int]
    resource: str
    namespace: str
    label_selector: str
    field_selector: str
    mode: DeliveryMode
    resume_cursor: str
    view: _object_pb2.ObjectView
    def __init__(self, resource: _Optional[str] = ..., namespace: _Optional[str] = ..., label_selector: _Optional[str] = ..., field_selector: _Optional[str] = ..., mode: _Optional[_Union[DeliveryMode, str]] = ..., resume_cursor: _Optional[str] = ..., view: _Optional[_Union[_object_pb2.ObjectView, _Mapping]] = ...) -> None: ...

class SubscribeResponse(_message.Message):
    __slots__ = ("type", "object", "cursor", "consistency", "previous_resource_version")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_RESOURCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    type: EventType
    object: _object_pb2.KubeObject
    cursor: str
    consistency: Consistency
    previous_resource_version: str
    def __init__(self, type: _Optional[_Union[EventType, str]] = ..., object: _Optional[_Union[_object_pb2.KubeObject, _Mapping]] = ..., cursor: _Optional[str] = ..., consistency: _Optional[_Union[Consistency, str]] = ..., previous_resource_version: _Optional[str] = ...) -> None: ...
