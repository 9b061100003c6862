"""A verifying flatbuffers table reader and a small table writer on the `flatbuffers` runtime.

flatbuffers readers (the generated Python accessors included) trust every offset in the file;
`Table` checks each one before use: table and vtable bounds, field offsets inside their table,
vector lengths inside the buffer, strings as UTF-8. A bad file raises `FormatError` naming the
file and what was wrong, never an IndexError or a read past the end.
"""

import struct
from collections.abc import Sequence

import flatbuffers
import numpy as np

from ...errors import FormatError

MAX_VTABLE = 1 << 12  # bytes; the schemas used here have fewer than 16 fields per table


class Buffer:
    """The bytes of one file and the name it is reported under."""

    def __init__(self, data: bytes, source: str):
        self.data = memoryview(data).cast("B")
        self.source = source

    def fail(self, what: str) -> FormatError:
        return FormatError(f"{self.source}: corrupt flatbuffer: {what}")

    def need(self, pos: int, size: int, what: str) -> None:
        if pos < 0 or size < 0 or pos + size > len(self.data):
            raise self.fail(f"{what} at byte {pos} (+{size}) is outside the file")

    def unpack(self, fmt: str, pos: int, what: str):
        self.need(pos, struct.calcsize(fmt), what)
        return struct.unpack_from(fmt, self.data, pos)[0]

    def root(self, identifier: bytes | None = None) -> "Table":
        self.need(0, 8, "header")
        if identifier is not None and bytes(self.data[4:8]) != identifier:
            raise self.fail(f"file identifier {bytes(self.data[4:8])!r}, expected {identifier!r}")
        return Table(self, self.unpack("<I", 0, "root offset"), "root table")


class Table:
    """One table of a `Buffer`, its vtable checked on construction."""

    def __init__(self, buf: Buffer, pos: int, what: str):
        self.buf, self.pos, self.what = buf, pos, what
        vtable = pos - buf.unpack("<i", pos, f"{what} vtable offset")
        vsize = buf.unpack("<H", vtable, f"{what} vtable")
        tsize = buf.unpack("<H", vtable + 2, f"{what} vtable")
        if vsize < 4 or vsize % 2 or vsize > MAX_VTABLE or tsize < 4:
            raise buf.fail(f"{what} has a malformed vtable (sizes {vsize}, {tsize})")
        buf.need(vtable, vsize, f"{what} vtable")
        buf.need(pos, tsize, what)
        self.vtable, self.vsize, self.tsize = vtable, vsize, tsize

    def _field(self, slot: int, size: int) -> int | None:
        """The position of field `slot` (checked to hold `size` bytes in the table), or None."""
        entry = 4 + 2 * slot
        if entry + 2 > self.vsize:
            return None
        offset = self.buf.unpack("<H", self.vtable + entry, self.what)
        if offset == 0:
            return None
        if offset + size > self.tsize:
            raise self.buf.fail(f"{self.what} field {slot} lies outside its table")
        return self.pos + offset

    def scalar(self, slot: int, fmt: str, default=0):
        pos = self._field(slot, struct.calcsize(fmt))
        return default if pos is None else self.buf.unpack("<" + fmt, pos, self.what)

    def _target(self, slot: int) -> int | None:
        pos = self._field(slot, 4)
        if pos is None:
            return None
        return pos + self.buf.unpack("<I", pos, f"{self.what} field {slot}")

    def table(self, slot: int, what: str) -> "Table | None":
        target = self._target(slot)
        return None if target is None else Table(self.buf, target, what)

    def _vector(self, slot: int, item: int, what: str) -> tuple[int, int] | None:
        start = self._target(slot)
        if start is None:
            return None
        count = self.buf.unpack("<I", start, what)
        self.buf.need(start + 4, count * item, f"{what} of {count} elements")
        return start + 4, count

    def array(self, slot: int, dtype: str, what: str) -> np.ndarray:
        """A vector of scalars as a numpy array (a copy; empty when absent)."""
        dt = np.dtype(dtype).newbyteorder("<")
        found = self._vector(slot, dt.itemsize, what)
        if found is None:
            return np.zeros(0, dt)
        start, count = found
        return np.frombuffer(self.buf.data, dt, count, start).astype(dt.newbyteorder("="))

    def tables(self, slot: int, what: str) -> list["Table"]:
        found = self._vector(slot, 4, what)
        if found is None:
            return []
        start, count = found
        return [
            Table(self.buf, start + 4 * i + self.buf.unpack("<I", start + 4 * i, what), what)
            for i in range(count)
        ]

    def string(self, slot: int, what: str) -> str:
        found = self._vector(slot, 1, what)
        if found is None:
            return ""
        start, count = found
        try:
            return bytes(self.buf.data[start : start + count]).decode("utf-8")
        except UnicodeDecodeError:
            raise self.buf.fail(f"{what} is not UTF-8") from None

    def bytes(self, slot: int, what: str) -> memoryview:
        found = self._vector(slot, 1, what)
        if found is None:
            return memoryview(b"")
        start, count = found
        return self.buf.data[start : start + count]


# -- writing ------------------------------------------------------------------------------------
# A field to write: (slot, kind, value) with kind one of the `_SLOTS` scalar kinds or "offset"
# (a table, vector or string already built).
Field = tuple[int, str, object]

_SLOTS = {
    "bool": "PrependBoolSlot",
    "byte": "PrependInt8Slot",
    "ubyte": "PrependUint8Slot",
    "int": "PrependInt32Slot",
    "uint": "PrependUint32Slot",
    "long": "PrependInt64Slot",
    "ulong": "PrependUint64Slot",
    "float": "PrependFloat32Slot",
    "offset": "PrependUOffsetTRelativeSlot",
}


def table(builder: flatbuffers.Builder, fields: Sequence[Field]) -> int:
    """Build a table from its fields; zero scalars are written (readers of options read them)."""
    slots = max((slot for slot, _, _ in fields), default=-1) + 1
    builder.StartObject(slots)
    for slot, kind, value in fields:
        if kind == "offset":
            builder.PrependUOffsetTRelativeSlot(slot, value, 0)
        else:
            getattr(builder, _SLOTS[kind])(slot, value, None)
    return builder.EndObject()


def numbers(builder: flatbuffers.Builder, values, dtype: str) -> int:
    return builder.CreateNumpyVector(np.asarray(values, np.dtype(dtype).newbyteorder("<")))


def offsets(builder: flatbuffers.Builder, items: Sequence[int]) -> int:
    builder.StartVector(4, len(items), 4)
    for item in reversed(items):
        builder.PrependUOffsetTRelative(item)
    return builder.EndVector()


def raw_bytes(builder: flatbuffers.Builder, data: bytes, alignment: int = 16) -> int:
    """A [ubyte] vector aligned to `alignment` (Buffer.data is force_align: 16)."""
    builder.StartVector(1, len(data), alignment)
    builder.head -= len(data)
    builder.Bytes[builder.head : builder.head + len(data)] = data
    return builder.EndVector(len(data))
