"""The onebuild IR file (`.obir`): see docs/ir-format.md.

Layout (little-endian): an 8-byte magic, a fixed header (format version, JSON length, data
offset, data length), the canonical JSON description of the model, zero padding to 64 bytes,
the tensor data (each tensor 64-byte aligned), and a SHA-256 of everything before it.
Loading checks sizes and the checksum before anything is decoded and memory-maps the weights;
nothing is unpickled or evaluated.
"""

import hashlib
import json
import mmap
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import FormatError, IRError, UserError
from ...fileio import atomic_writer
from .. import dtypes
from ..ir import Graph, Model, Value
from ..tensor import QuantParams, Tensor

MAGIC = b"OBIR\x89\r\n\x1a"
FORMAT_VERSION = 1
_FIXED = struct.Struct("<8sIIQQQ")  # magic, version, reserved, json length, data offset, length
ALIGN = 64
DIGEST = 32


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _plain(obj: Any) -> Any:
    """Attribute values as JSON-native types (numpy scalars and arrays become numbers/lists)."""
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"attribute value {obj!r} is not serializable")


def _quant(q: QuantParams | None) -> dict | None:
    if q is None:
        return None
    return {"scale": list(q.scale), "zero_point": list(q.zero_point), "axis": q.axis}


def _value_entry(value: Value) -> dict:
    entry = {"name": value.name, "dtype": dtypes.name_of(value.dtype), "shape": list(value.shape)}
    if value.quant is not None:
        entry["quant"] = _quant(value.quant)
    return entry


def describe(model: Model) -> tuple[dict, list[tuple[int, Value]]]:
    """The JSON description and the (offset, constant) layout of the data section."""
    offset, layout, graphs = 0, [], []
    for graph in model.graphs:
        constants = []
        for value in graph.constants.values():
            entry = _value_entry(value)
            entry["offset"] = offset
            entry["nbytes"] = value.const.nbytes
            constants.append(entry)
            layout.append((offset, value))
            offset = _align(offset + value.const.nbytes)
        nodes = [
            {
                "name": node.name,
                "op": node.op,
                "inputs": [None if v is None else v.name for v in node.inputs],
                "outputs": [_value_entry(v) for v in node.outputs],
                "attrs": node.attrs,
            }
            for node in graph.nodes
        ]
        graphs.append(
            {
                "name": graph.name,
                "inputs": [_value_entry(v) for v in graph.inputs],
                "outputs": [v.name for v in graph.outputs],
                "constants": constants,
                "nodes": nodes,
            }
        )
    header = {
        "format": "onebuild-ir",
        "version": FORMAT_VERSION,
        "metadata": model.metadata,
        "graphs": graphs,
    }
    return header, layout


def save_ir(model: Model, path: str | os.PathLike) -> str:
    """Write `model` atomically; returns the SHA-256 (hex) stored in the file's trailer."""
    header, layout = describe(model)
    text = json.dumps(header, sort_keys=True, separators=(",", ":"), default=_plain).encode()
    data_offset = _align(_FIXED.size + len(text))
    data_length = layout[-1][0] + layout[-1][1].const.nbytes if layout else 0
    digest = hashlib.sha256()
    with atomic_writer(path) as handle:

        def emit(chunk: bytes | memoryview) -> None:
            digest.update(chunk)
            handle.write(chunk)

        emit(_FIXED.pack(MAGIC, FORMAT_VERSION, 0, len(text), data_offset, data_length))
        emit(text)
        emit(b"\0" * (data_offset - _FIXED.size - len(text)))
        position = 0
        for offset, value in layout:
            emit(b"\0" * (offset - position))
            array = np.ascontiguousarray(value.numpy())
            if array.dtype.byteorder == ">":
                array = array.astype(array.dtype.newbyteorder("<"))
            emit(memoryview(array.reshape(-1).view(np.uint8)))
            position = offset + value.const.nbytes
        handle.write(digest.digest())
    return digest.hexdigest()


def load_ir(path: str | os.PathLike) -> Model:
    """Read an IR file, validating magic, version, sizes and checksum first."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size < _FIXED.size + DIGEST:
            raise FormatError(f"{path}: not an onebuild IR file (too short: {size} bytes)")
        buffer = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    magic, version, _, text_len, data_offset, data_length = _FIXED.unpack_from(buffer, 0)
    if magic != MAGIC:
        raise FormatError(f"{path}: not an onebuild IR file (bad magic)")
    if version != FORMAT_VERSION:
        raise FormatError(
            f"{path}: IR format version {version}; this onebuild reads {FORMAT_VERSION}"
        )
    body = data_offset + data_length
    if data_offset < _FIXED.size + text_len or body + DIGEST != size:
        raise FormatError(
            f"{path}: corrupt or truncated IR file (sections declare {body + DIGEST} bytes, "
            f"file has {size})"
        )
    if hashlib.sha256(memoryview(buffer)[:body]).digest() != buffer[body:size]:
        raise FormatError(f"{path}: checksum mismatch: the IR file is corrupt; rebuild it")
    try:
        header = json.loads(bytes(buffer[_FIXED.size : _FIXED.size + text_len]))
        return _build(header, buffer, data_offset, data_length)
    except FormatError:
        raise
    except (ValueError, KeyError, TypeError, IndexError, IRError) as error:
        raise FormatError(f"{path}: invalid IR description ({error})") from None


def _value_type(entry: dict) -> tuple[np.dtype, tuple[int, ...], QuantParams | None]:
    quant = entry.get("quant")
    if quant is not None:
        quant = QuantParams(tuple(quant["scale"]), tuple(quant["zero_point"]), quant["axis"])
    return dtypes.dtype(entry["dtype"]), tuple(entry["shape"]), quant


def _build(header: dict, buffer, data_offset: int, data_length: int) -> Model:
    if header.get("format") != "onebuild-ir":
        raise FormatError("the description is not an onebuild IR model")
    graphs = []
    for spec in header["graphs"]:
        graph = Graph(spec["name"])
        values: dict[str, Value] = {}
        for entry in spec["inputs"]:
            dtype, shape, quant = _value_type(entry)
            values[entry["name"]] = value = graph.add_input(entry["name"], dtype, shape)
            value.quant = quant
        for entry in spec["constants"]:
            dtype, shape, quant = _value_type(entry)
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            offset = int(entry["offset"])
            if nbytes != entry["nbytes"] or offset < 0 or offset + nbytes > data_length:
                raise FormatError(f"constant '{entry['name']}' lies outside the data section")
            tensor = Tensor.mapped(buffer, data_offset + offset, dtype, shape)
            values[entry["name"]] = value = graph.add_constant(tensor, entry["name"])
            value.quant = quant
        for entry in spec["nodes"]:
            inputs = [None if name is None else values[name] for name in entry["inputs"]]
            names = [out["name"] for out in entry["outputs"]]
            node = graph.make_node(entry["op"], inputs, entry["attrs"], entry["name"], names)
            for value, out in zip(node.outputs, entry["outputs"]):
                dtype, shape, quant = _value_type(out)
                if (value.dtype, value.shape, value.name) != (dtype, shape, out["name"]):
                    raise FormatError(f"node '{entry['name']}': stored output type is inconsistent")
                value.quant = quant
                values[value.name] = value
        graph.outputs = [values[name] for name in spec["outputs"]]
        graphs.append(graph)
    return Model(graphs, dict(header.get("metadata", {})))
