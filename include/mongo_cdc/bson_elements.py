"""BSON documents as elements, read and rebuilt without decoding a value.

An element is a type byte, a name (a C string) and a value whose length its type gives. A
``Container`` holds a document's (or an array's) elements as the bytes they are; only the
documents and arrays an edit goes into are opened in turn, and rebuilding copies every element
nothing changed byte for byte, so a value of any type (the deprecated Symbol, DBPointer and
Undefined, code with scope, NaN payloads, non-canonical decimals) keeps its type and bits, and a
field name keeps its bytes, whatever it looks like (``$``-prefixed, dotted, empty, a DBRef's key
set).

Every document opened and every element read has its length checked against what holds it: a
truncated or damaged document raises ``DamagedBson``, never a silent cut.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

# element types
DOUBLE = 0x01
STRING = 0x02
DOCUMENT = 0x03
ARRAY = 0x04
BINARY = 0x05
UNDEFINED = 0x06  # deprecated
OBJECT_ID = 0x07
BOOL = 0x08
DATE = 0x09  # UTC datetime
NULL = 0x0A
REGEX = 0x0B  # two C strings
DB_POINTER = 0x0C  # a string then an ObjectId (deprecated)
CODE = 0x0D  # JavaScript code
SYMBOL = 0x0E  # deprecated
CODE_WITH_SCOPE = 0x0F  # int32 total length, a string, a document
INT32 = 0x10
TIMESTAMP = 0x11
INT64 = 0x12
DECIMAL = 0x13  # decimal128
MIN_KEY = 0xFF
MAX_KEY = 0x7F
CONTAINERS = (DOCUMENT, ARRAY)

# value lengths of the types whose length is fixed
FIXED_SIZES = {
    DOUBLE: 8,
    UNDEFINED: 0,
    OBJECT_ID: 12,
    BOOL: 1,
    DATE: 8,
    NULL: 0,
    INT32: 4,
    TIMESTAMP: 8,
    INT64: 8,
    DECIMAL: 16,
    MIN_KEY: 0,
    MAX_KEY: 0,
}
_STRINGS = (STRING, CODE, SYMBOL)  # int32 length, bytes, NUL
_int32 = struct.Struct("<i")
_read_int32 = _int32.unpack_from


class DamagedBson(ValueError):
    """A document whose lengths do not fit its bytes: truncated or damaged where it is stored."""


class Container:
    """A document or an array opened into its elements, to read or edit some and copy the others.

    Element ``position`` has a type (``kinds``) and a name (``names``: bytes; an array's are its
    positions in decimal); its value is its bytes as they stand (``value``) or, once an edit went
    into it, an opened ``Container``. ``to_bytes`` of a container nothing was done to gives its
    bytes back exactly.
    """

    __slots__ = ("kind", "names", "kinds", "_elements", "_positions")

    def __init__(self, kind: int, data: bytes, start: int = 0) -> None:
        """The document (``kind`` DOCUMENT) or array that is ``data[start:]``; DamagedBson where
        its length or an element's does not fit."""
        self.kind = kind
        self.names: list[bytes] = []
        self.kinds: list[int] = []
        # each element's own bytes (type, name, value), or an opened Container of its value
        self._elements: list[bytes | Container] = []
        self._positions: dict[bytes, int] | None = None  # a document's first element of each name
        end = document_end(data, start)
        if end != len(data):
            raise DamagedBson(f"a document at byte {start} ends {len(data) - end} bytes before its data")
        last = end - 1  # the closing NUL
        position = start + 4
        find, fixed_size = data.find, FIXED_SIZES.get
        add_name, add_kind, add_element = self.names.append, self.kinds.append, self._elements.append
        while position < last:
            element_kind = data[position]
            name_end = find(b"\x00", position + 1, last)
            if name_end < 0:
                raise DamagedBson(f"an element name at byte {position} runs past its document's end")
            size = fixed_size(element_kind)
            if size is None:
                end = value_end_of(data, element_kind, name_end + 1, last, position)
            else:
                end = name_end + 1 + size
            if end > last:
                raise DamagedBson(f"the value of an element at byte {position} runs past its document's end")
            add_name(data[position + 1 : name_end])
            add_kind(element_kind)
            add_element(data[position:end])
            position = end

    def __len__(self) -> int:
        return len(self._elements)

    def position(self, key: bytes) -> int | None:
        """Where element ``key`` is: in a document the first of that name, in an array the position
        it names; None if there is none."""
        if self.kind == ARRAY:
            index = array_index(key)
            return index if index is not None and index < len(self._elements) else None
        if self._positions is None:
            self._positions = {}
            for position, name in enumerate(self.names):
                self._positions.setdefault(name, position)
        return self._positions.get(key)

    def value(self, position: int) -> bytes:
        """The value's bytes as they stand in a document (after its type and name)."""
        element = self._elements[position]
        if isinstance(element, Container):
            return element.to_bytes()
        return element[len(self.names[position]) + 2 :]

    def opened(self, position: int) -> Container | None:
        """The document or array at ``position``, opened where it stands; None for another type."""
        element = self._elements[position]
        if isinstance(element, Container):
            return element
        kind = self.kinds[position]
        if kind not in CONTAINERS:
            return None
        self._elements[position] = inner = Container(kind, element, len(self.names[position]) + 2)
        return inner

    def replace(self, position: int, kind: int, value: bytes) -> None:
        self.kinds[position] = kind
        self._elements[position] = element_bytes(kind, self.names[position], value)

    def rename(self, position: int, name: bytes) -> None:
        element = self._elements[position]
        if isinstance(element, bytes):
            self._elements[position] = element[:1] + name + element[1 + len(self.names[position]) :]
        self.names[position] = name
        self._positions = None

    def append(self, name: bytes, kind: int, value: bytes) -> None:
        if self._positions is not None:
            self._positions.setdefault(name, len(self._elements))
        self.names.append(name)
        self.kinds.append(kind)
        self._elements.append(element_bytes(kind, name, value))

    def remove(self, position: int) -> None:
        del self.names[position], self.kinds[position], self._elements[position]
        self._positions = None

    def truncate(self, size: int) -> None:
        del self.names[size:], self.kinds[size:], self._elements[size:]
        self._positions = None

    def to_bytes(self) -> bytes:
        return document_bytes(
            element if isinstance(element, bytes) else element_bytes(kind, name, element.to_bytes())
            for kind, name, element in zip(self.kinds, self.names, self._elements, strict=True)
        )


def document_end(data: bytes, start: int = 0, limit: int | None = None) -> int:
    """Where the document at ``data[start:]`` ends, checked to fit before ``limit`` (the data's end)."""
    limit = len(data) if limit is None else limit
    if start + 5 > limit:
        raise DamagedBson(
            f"a document at byte {start} is cut short: {limit - start} bytes left, 5 at least needed"
        )
    end = start + _read_int32(data, start)[0]
    if end < start + 5 or end > limit:
        raise DamagedBson(
            f"a document at byte {start} says it has {end - start} bytes, but {limit - start} are there"
        )
    if data[end - 1] != 0:
        raise DamagedBson(f"a document at byte {start} of {end - start} bytes does not end with a NUL")
    return end


def value_end_of(data: bytes, kind: int, value: int, limit: int, element: int) -> int:
    """Where the value of an element of a type whose length is not fixed (``FIXED_SIZES``) ends:
    ``kind`` its type, ``value`` where it starts, ``limit`` its document's end, ``element`` where
    the element starts (to name in errors). DamagedBson where it does not fit, or for a type BSON
    does not have."""
    if kind in _STRINGS:
        return _string_end(data, value, limit)
    if kind in CONTAINERS:
        return document_end(data, value, limit)
    if kind == BINARY:
        size = _read_int32(data, value)[0] if value + 5 <= limit else -1
        if size < 0:
            raise DamagedBson(f"a binary value at byte {value} is cut short or has a negative length")
        return value + 5 + size  # its length, subtype byte and bytes
    if kind == REGEX:
        pattern_end = data.find(b"\x00", value, limit)
        options_end = data.find(b"\x00", pattern_end + 1, limit) if pattern_end >= 0 else -1
        if options_end < 0:
            raise DamagedBson(f"a regular expression at byte {value} runs past its document's end")
        return options_end + 1
    if kind == DB_POINTER:
        return _string_end(data, value, limit) + 12
    if kind == CODE_WITH_SCOPE:
        if value + 4 > limit:
            raise DamagedBson(f"a code with scope at byte {value} is cut short")
        end = value + _read_int32(data, value)[0]
        if end > limit or document_end(data, _string_end(data, value + 4, end), end) != end:
            raise DamagedBson(f"a code with scope at byte {value} does not fit its length")
        return end
    raise DamagedBson(f"unknown BSON type 0x{kind:02x} at byte {element}")


def _string_end(data: bytes, value: int, limit: int) -> int:
    if value + 4 > limit:
        raise DamagedBson(f"a string at byte {value} is cut short")
    end = value + 4 + _read_int32(data, value)[0]
    if end < value + 5 or end > limit or data[end - 1] != 0:
        raise DamagedBson(f"a string at byte {value} does not fit its length or lacks its closing NUL")
    return end


def element_bytes(kind: int, name: bytes, value: bytes) -> bytes:
    """One element: ``value`` is its value's bytes as they stand in a document."""
    return b"%c%b\x00%b" % (kind, name, value)


def document_bytes(parts: Iterable[bytes]) -> bytes:
    """A document of ``parts`` (elements, or runs of elements copied from another document)."""
    body = b"".join(parts)
    return _int32.pack(len(body) + 5) + body + b"\x00"


def array_index(key: bytes) -> int | None:
    """The array position a path component names (ASCII digits), else None."""
    return int(key) if key.isdigit() else None
