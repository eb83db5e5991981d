from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class Fence(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FENCE_UNSPECIFIED: _ClassVar[Fence]
    FENCE_APISERVER: _ClassVar[Fence]
    FENCE_DAEMON: _ClassVar[Fence]
FENCE_UNSPECIFIED: Fence
FENCE_APISERVER: Fence
FENCE_DAEMON: Fence

class KubeObject(_message.Message):
    __slots__ = ("uid", "namespace", "name", "resource_version", "json")
    UID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    uid: str
    namespace: str
    name: str
    resource_version: str
    json: bytes
    def __init__(self, uid: _Optional[str] = ..., namespace: _Optional[str] = ..., name: _Optional[str] = ..., resource_version: _Optional[str] = ..., json: _Optional[bytes] = ...) -> None: ...

class ObjectView(_message.Message):
    __slots__ = ("metadata_only", "fields", "managed_fields")
    METADATA_ONLY_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    MANAGED_FIELDS_FIELD_NUMBER: _ClassVar[int]
    metadata_only: bool
    fields: _containers.RepeatedScalarFieldContainer[str]
    managed_fields: bool
    def __init__(self, metadata_only: _Optional[bool] = ..., fields: _Optional[_Iterable[str]] = ..., managed_fields: _Optional[bool] = ...) -> None: ...

class WriteGuard(_message.Message):
    __slots__ = ("election", "namespace", "term")
    ELECTION_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    election: str
    namespace: str
    term: int
    def __init__(self, election: _Optional[str] = ..., namespace: _Optional[str] = ..., term: _Optional[int] = ...) -> None: ...
