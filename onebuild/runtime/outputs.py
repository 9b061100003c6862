"""Files at paths the user names (the session's quantized and codegen model paths, `run -o`,
`export -o`, `import -o`): onebuild replaces only a file it wrote itself, recognized by the
signature of the format it writes there, and creates no folders. Anything else is refused
with one line naming the path, what is in the way and how to fix it; nothing is touched.

Signatures: an IR file begins with its magic; a binary is one an installed target recognizes;
a circle/tflite flatbuffer names "onebuild" as its description, an ONNX model as its
producer; an npz carries onebuild's archive comment (`npz.NPZ_MARK`).
"""

import mmap
import os
import zipfile
from collections.abc import Iterable
from pathlib import Path

from ..errors import FormatError, UserError
from ..graph_ir.serde.irfile import MAGIC as IR_MAGIC
from ..npz import NPZ_MARK

PRODUCER = "onebuild"
FLATBUFFER_IDS = {"circle": b"CIR0", "tflite": b"TFL3"}
ONNX_PRODUCER_FIELD = 2
NAMES = {"obir": "an IR file", "binary": "a compiled binary", "circle": "a circle model",
         "tflite": "a tflite model", "onnx": "an ONNX model", "npz": "an npz file"}  # fmt: skip


def writable(
    path: str | os.PathLike,
    kinds: Iterable[str],
    option: str,
    inputs: Iterable[str | os.PathLike] = (),
) -> Path:
    """`path`, if onebuild may write a file of one of `kinds` ("obir", "binary", "circle",
    "tflite", "onnx", "npz") there for `option` (how the user named it, for the message): its
    folder exists, and nothing is there or a file of those kinds that onebuild wrote, which is
    none of `inputs` (the files the command or session reads)."""
    path, kinds = Path(path), tuple(kinds)
    fix = f"choose another path for {option}"
    if path.is_dir():
        raise UserError(f"{path}: is a folder; {option} takes a file path")
    folder = path.parent
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise UserError(
            f"{path}: folder {folder} {what}; onebuild creates no folders: create it or {fix}"
        )
    if not (path.exists() or path.is_symlink()):
        return path
    for source in inputs:
        if Path(source).exists() and path.samefile(source):
            raise UserError(f"{path}: {option} names its own input, a file it reads; {fix}")
    if not any(made_by_onebuild(path, kind) for kind in kinds):
        what = " or ".join(NAMES[kind] for kind in kinds)
        raise UserError(
            f"{path}: exists and is not {what} onebuild wrote, so it is not replaced: move it "
            f"away or {fix}"
        )
    return path


def quantized_kind(path: str | os.PathLike) -> str:
    """What the session writes at a quantized model path: a circle for .circle, else IR."""
    return "circle" if Path(path).suffix == ".circle" else "obir"


def made_by_onebuild(path: Path, kind: str) -> bool:
    """Whether the file at `path` is a `kind` file onebuild wrote (by its signature)."""
    try:
        if kind == "obir":
            with open(path, "rb") as handle:
                return handle.read(len(IR_MAGIC)) == IR_MAGIC
        if kind == "binary":
            from ..targets import binary_target

            return path.is_file() and binary_target(path) is not None
        if kind in FLATBUFFER_IDS:
            return _flatbuffer_description(path, FLATBUFFER_IDS[kind]) == PRODUCER
        if kind == "onnx":
            with open(path, "rb") as handle:
                return _onnx_producer(handle.read(256)) == PRODUCER
        if kind == "npz":
            return _onebuild_npz(path)
    except (OSError, ValueError, FormatError, zipfile.BadZipFile):
        return False
    raise ValueError(f"unknown output kind '{kind}'")


def _flatbuffer_description(path: Path, identifier: bytes) -> str | None:
    from ..graph_ir.serde.flatbuf import Buffer

    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as m:
        buffer = Buffer(m, str(path))
        try:
            return buffer.root(identifier).string(3, "description")
        finally:
            buffer.data.release()


def _onnx_producer(head: bytes) -> str | None:
    """ModelProto.producer_name, from the fields that precede it (ir_version, as onnx writes
    fields in number order), or None."""
    at = 0
    while at < len(head):
        key, at = _varint(head, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, at = _varint(head, at)
        elif wire == 2:
            size, at = _varint(head, at)
            if number == ONNX_PRODUCER_FIELD:
                return head[at : at + size].decode("utf-8", errors="replace")
            at += size
        else:
            return None
        if number > ONNX_PRODUCER_FIELD:
            return None
    return None


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value, shift = 0, 0
    while at < len(data) and shift < 64:
        byte = data[at]
        value, at, shift = value | (byte & 0x7F) << shift, at + 1, shift + 7
        if byte < 0x80:
            return value, at
    raise ValueError("truncated varint")


def _onebuild_npz(path: Path) -> bool:
    """An npz that `npz.write_npz` wrote: its archive comment is onebuild's mark."""
    with zipfile.ZipFile(path) as archive:
        return archive.comment == NPZ_MARK
