"""Zip archives forged by hand for the hostile-package corpus: what zipfile would refuse to
write (duplicate names, lying sizes, encrypted or symlink flags, unknown methods, wrong entry
counts) and zip bombs of zero bytes made of repeated deflate blocks."""

import io
import struct
import zipfile
import zlib
from dataclasses import dataclass

MiB = 1 << 20


def deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(6, zlib.DEFLATED, -15)
    return packer.compress(data) + packer.flush()


def zeros_member(size: int) -> tuple[bytes, int]:
    """A raw deflate stream of `size` zero bytes made of repeated 1 MiB blocks (about 1 KB
    each), and its CRC-32."""
    packer, block = zlib.compressobj(9, zlib.DEFLATED, -15), bytes(MiB)
    chunk = packer.compress(block) + packer.flush(zlib.Z_FULL_FLUSH)
    stream = chunk * (size // MiB) + packer.flush()
    crc = 0
    for _ in range(size // MiB):
        crc = zlib.crc32(block, crc)
    return stream, crc


@dataclass
class Member:
    name: str
    data: bytes  # as stored
    crc: int
    size: int  # declared uncompressed size
    method: int = zipfile.ZIP_DEFLATED
    flags: int = 0
    mode: int = 0o100644


def member(name: str, content: bytes, **changes) -> Member:
    fields = {"data": deflate(content), "crc": zlib.crc32(content), "size": len(content)}
    return Member(name, **{**fields, **changes})


def raw_zip(members: list[Member], entries: int | None = None) -> bytes:
    """A zip written by hand, so it can say what zipfile would refuse to write."""
    out, central = io.BytesIO(), io.BytesIO()
    for m in members:
        name = m.name.encode()
        offset = out.tell()
        out.write(struct.pack("<4sHHHHHLLLHH", b"PK\x03\x04", 20, m.flags, m.method, 0, 33,
                              m.crc, len(m.data), m.size, len(name), 0))  # fmt: skip
        out.write(name + m.data)
        central.write(struct.pack("<4sHHHHHHLLLHHHHHLL", b"PK\x01\x02", 0x314, 20, m.flags,
                                  m.method, 0, 33, m.crc, len(m.data), m.size, len(name), 0, 0,
                                  0, 0, m.mode << 16, offset))  # fmt: skip
        central.write(name)
    start, directory = out.tell(), central.getvalue()
    count = len(members) if entries is None else entries
    out.write(directory)
    out.write(
        struct.pack("<4sHHHHLLH", b"PK\x05\x06", 0, 0, count, count, len(directory), start, 0)
    )
    return out.getvalue()


def data_ranges(data: bytes) -> dict[str, tuple[int, int]]:
    """Where each member's stored data lies in a zip."""
    ranges = {}
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        for info in archive.infolist():
            start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
            ranges[info.filename] = (start, start + info.compress_size)
    return ranges


def flipped(data: bytes, position: int) -> bytes:
    return data[:position] + bytes([data[position] ^ 0x5A]) + data[position + 1 :]


_ZEROS: dict[int, tuple[bytes, int]] = {}


def zeros(size: int) -> tuple[bytes, int]:
    if size not in _ZEROS:
        _ZEROS[size] = zeros_member(size)
    return _ZEROS[size]
