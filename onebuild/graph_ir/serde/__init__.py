"""Formats at the edge of the IR: ONNX import and the IR file. The only code that imports onnx.

The IR file reader needs numpy only; the ONNX importer (and onnx itself) loads on first use, so
the device path (packages, the Session) runs where onnx is not installed.
"""

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from ...errors import UserError
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


def load_model(
    path: str | os.PathLike, input_shapes: Mapping[str, Sequence[int]] | None = None
) -> Model:
    """Load an IR file or an ONNX model, recognized by content (not by file name)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    with open(path, "rb") as handle:
        head = handle.read(len(MAGIC))
    if head == MAGIC:
        if input_shapes:
            raise UserError(f"{path}: input shapes of an IR file are fixed; set them on import")
        return load_ir(path)
    return load_onnx(path, input_shapes)


__all__ = ["load_ir", "load_model", "load_onnx", "save_ir"]
