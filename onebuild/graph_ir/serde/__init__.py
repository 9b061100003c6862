"""Formats at the edge of the IR: ONNX import and the IR file. The only code that imports onnx.

The IR file reader needs numpy only; the ONNX importer (and onnx itself) loads on first use, so
the device path (packages, the Session) runs where onnx is not installed.
"""

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from ...errors import UserError
from ...fileio import not_a_file
from ..ir import Model
from .irfile import MAGIC, load_ir, save_ir


def load_onnx(
    path: str | os.PathLike,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    input_values: Mapping[str, object] | None = None,
) -> Model:
    """An ONNX model as IR (see `onnx_import.load_onnx`); `input_values` pins inputs to
    constants."""
    from .onnx_import import load_onnx as load

    return load(path, input_shapes, input_values)


def read_circle(data, fmt: str | None = None) -> Model:
    """A circle or tflite model (bytes or path) as IR; `fmt` ("circle"/"tflite") checks the
    file identifier, None accepts either (see `circle_read`)."""
    from .circle_read import read_flatbuffer

    return read_flatbuffer(data, fmt)


def write_circle(model: Model, fmt: str = "circle") -> bytes:
    """The main graph as a circle (or, with fmt="tflite", a tflite) flatbuffer."""
    from .circle_write import write_flatbuffer

    return write_flatbuffer(model, fmt)


def is_flatbuffer_model(path: str | os.PathLike) -> bool:
    """Whether the file carries the circle or tflite file identifier."""
    with open(path, "rb") as handle:
        return handle.read(8)[4:8] in (b"CIR0", b"TFL3")


def quantized_source(path: str | os.PathLike) -> bool:
    """Whether an import source states quantization (circle/tflite: parameters on its
    activations; ONNX: QDQ, QOperator or dynamic ops), from a cheap read of the file's framing.
    False for a file that cannot be read (its import says why)."""
    try:
        flat = Path(path).suffix.lower() in (".circle", ".tflite") or is_flatbuffer_model(path)
    except OSError:
        return False
    if flat:
        from .circle_read import quantized_flatbuffer

        return quantized_flatbuffer(path)
    from .onnx_wire import quantized_onnx

    return quantized_onnx(path)


def load_source(
    path: str | os.PathLike,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    input_values: Mapping[str, object] | None = None,
) -> Model:
    """An import source by suffix: .circle / .tflite flatbuffers, else ONNX."""
    if Path(path).suffix.lower() in (".circle", ".tflite"):
        if input_shapes or input_values:
            raise UserError(f"{path}: input shapes and constants apply to ONNX sources only")
        return read_circle(path, Path(path).suffix.lower()[1:])
    return load_onnx(path, input_shapes, input_values)


def load_model(
    path: str | os.PathLike, input_shapes: Mapping[str, Sequence[int]] | None = None
) -> Model:
    """Load an IR file, a circle/tflite model or an ONNX model, recognized by content (a
    .circle or .tflite suffix always goes to the flatbuffer reader)."""
    path = Path(path)
    if not path.is_file():
        raise not_a_file(path)
    with open(path, "rb") as handle:
        head = handle.read(len(MAGIC))
    if head == MAGIC:
        if input_shapes:
            raise UserError(f"{path}: input shapes of an IR file are fixed; set them on import")
        return load_ir(path)
    if path.suffix.lower() in (".circle", ".tflite") or is_flatbuffer_model(path):
        if input_shapes:
            raise UserError(f"{path}: input shapes of a circle/tflite model are fixed")
        return read_circle(path)
    return load_onnx(path, input_shapes)


__all__ = [
    "load_ir",
    "load_model",
    "load_onnx",
    "load_source",
    "read_circle",
    "save_ir",
    "write_circle",
]
