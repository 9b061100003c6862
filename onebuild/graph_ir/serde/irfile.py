"""The onebuild IR file (`.obir`): see docs/ir-format.md.

Layout (little-endian): an 8-byte magic, a fixed header (format version, JSON length, data
offset, data length), the canonical JSON description of the model, zero padding to 64 bytes,
the tensor data (each tensor 64-byte aligned), and a SHA-256 of everything before it.
Loading checks sizes and the checksum before anything is decoded and memory-maps the weights;
nothing is unpickled or evaluated.
"""

import hashlib
import json
import math
import mmap
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import FormatError, IRError, UserError
from ...fields import Fields
from ...fileio import ANY_SIZE, atomic_writer, open_regular
from .. import dtypes
from ..ir import Graph, Model, Value
from ..ops import OPS
from ..tensor import QuantParams, Tensor
from .ir_attrs import arity, check_attributes, code_range

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


def _all_graphs(model: Model) -> tuple[list[Graph], dict[int, int]]:
    """The model's graphs, then the subgraphs their nodes hold (breadth first, each once), and
    each graph's index in that list (keyed by id)."""
    graphs = list(model.graphs)
    index = {id(g): i for i, g in enumerate(graphs)}
    for graph in graphs:  # grows while iterating: subgraphs of subgraphs come later
        for node in graph.nodes:
            for subgraph in node.subgraphs:
                if id(subgraph) not in index:
                    index[id(subgraph)] = len(graphs)
                    graphs.append(subgraph)
    return graphs, index


def _node_attrs(node, index: dict[int, int]) -> dict:
    """A node's attributes with each subgraph replaced by its index in `graphs`."""
    keys = OPS[node.op].subgraphs
    return {k: index[id(v)] if k in keys else v for k, v in node.attrs.items()}


def describe(model: Model) -> tuple[dict, list[tuple[int, Value]]]:
    """The JSON description and the (offset, constant) layout of the data section."""
    offset, layout, graphs = 0, [], []
    all_graphs, index = _all_graphs(model)
    for graph in all_graphs:
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
                "attrs": _node_attrs(node, index),
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


def _chunks(model: Model) -> Iterator[bytes | memoryview]:
    """The bytes of `model`'s IR file before its trailer (the digest of these bytes)."""
    header, layout = describe(model)
    text = json.dumps(header, sort_keys=True, separators=(",", ":"), default=_plain).encode()
    data_offset = _align(_FIXED.size + len(text))
    data_length = layout[-1][0] + layout[-1][1].const.nbytes if layout else 0
    yield _FIXED.pack(MAGIC, FORMAT_VERSION, 0, len(text), data_offset, data_length)
    yield text
    yield b"\0" * (data_offset - _FIXED.size - len(text))
    position = 0
    for offset, value in layout:
        yield b"\0" * (offset - position)
        array = np.ascontiguousarray(value.numpy())
        if array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("<"))
        yield memoryview(array.reshape(-1).view(np.uint8))
        position = offset + value.const.nbytes


def save_ir(model: Model, path: str | os.PathLike) -> str:
    """Write `model` atomically; returns the SHA-256 (hex) stored in the file's trailer. An
    existing file is replaced only if it is an IR file; no folders are created."""
    _check_output(Path(path))
    digest = hashlib.sha256()
    with atomic_writer(path) as handle:
        for chunk in _chunks(model):
            digest.update(chunk)
            handle.write(chunk)
        handle.write(digest.digest())
    return digest.hexdigest()


def _check_output(path: Path) -> None:
    """Refuse, with one line naming `path`, a missing folder or a file that is not an IR file."""
    if not path.parent.is_dir():
        raise UserError(
            f"{path}: folder {path.parent} does not exist; onebuild creates no folders: create "
            "it or choose another path"
        )
    if path.is_dir():
        raise UserError(f"{path}: is a folder; name an IR file (.obir) to write")
    if path.exists():
        try:
            with open_regular(path, ANY_SIZE) as handle:
                ours = handle.read(len(MAGIC)) == MAGIC
        except (OSError, UserError):  # a FIFO would block, a device not be ours
            ours = False
        if not ours:
            raise UserError(
                f"{path}: exists and is not an IR file, so it is not replaced: move it away or "
                "choose another path (.obir)"
            )


def load_ir(path: str | os.PathLike) -> Model:
    """Read an IR file, validating magic, version, sizes and checksum first."""
    path = Path(path)
    try:
        handle = open_regular(path, ANY_SIZE)  # mapped, not read: any size
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    with handle:
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
    except (ValueError, RecursionError) as error:
        raise FormatError(f"{path}: the IR description is not valid JSON ({error})") from None
    fields = Fields(
        lambda message: FormatError(
            f"{path}: invalid IR description: {message} (re-create the file with onebuild)"
        )
    )
    return _Loader(fields, buffer, data_offset, data_length).model(header)


MAX_VALUE_BYTES = 1 << 34  # no single tensor of a loadable model is this large (16 GiB)
HEADER_KEYS = {"format", "version", "metadata", "graphs"}
GRAPH_KEYS = {"name", "inputs", "outputs", "constants", "nodes"}
VALUE_KEYS, CONSTANT_KEYS = {"name", "dtype", "shape"}, {"offset", "nbytes"}
NODE_KEYS = {"name", "op", "inputs", "outputs", "attrs"}


class _Loader:
    """Builds a Model from a decoded description, checking every field's JSON type and range
    (through `Fields`, errors name the field's path) before it is used."""

    def __init__(self, fields: Fields, buffer, data_offset: int, data_length: int):
        self.f, self.buffer = fields, buffer
        self.data_offset, self.data_length = data_offset, data_length

    def model(self, header) -> Model:
        f = self.f
        f.obj(header, "description", HEADER_KEYS)
        f.require(header["format"] == "onebuild-ir", "format", "is not 'onebuild-ir'")
        f.integer(header["version"], "version", FORMAT_VERSION, FORMAT_VERSION)
        metadata = f.obj(header["metadata"], "metadata")
        for key, text in metadata.items():
            f.text(text, f"metadata.{key}", empty=True)
        specs = f.array(header["graphs"], "graphs", min_len=1)
        # A node's subgraph comes later in the list than its graph: build from the end.
        self.graphs: list[Graph | None] = [None] * len(specs)
        self.held: set[int] = set()
        for i in reversed(range(len(specs))):
            self.graphs[i] = self.graph(specs[i], f"graphs[{i}]", i)
        return Model([g for i, g in enumerate(self.graphs) if i not in self.held], dict(metadata))

    def value_type(self, entry, path: str, extra=frozenset()):
        f = self.f
        f.obj(entry, path, VALUE_KEYS | extra, {"quant"})
        name = f.text(entry["name"], f"{path}.name")
        try:
            dtype = dtypes.dtype(f.text(entry["dtype"], f"{path}.dtype"))
        except ValueError as error:
            raise f.error(f"{path}.dtype", str(error)) from None
        shape = f.shape(entry["shape"], f"{path}.shape")
        f.require(
            math.prod(shape) * dtype.itemsize <= MAX_VALUE_BYTES,
            f"{path}.shape",
            f"{list(shape)} of {dtypes.name_of(dtype)} exceeds {MAX_VALUE_BYTES} bytes",
        )
        quant = entry.get("quant")
        if quant is not None:
            quant = self.quant(quant, f"{path}.quant", dtype, shape)
        return name, dtype, shape, quant

    def quant(self, spec, path: str, dtype: np.dtype, shape) -> QuantParams:
        f = self.f
        f.obj(spec, path, {"scale", "zero_point", "axis"})
        axis = spec["axis"]
        if axis is not None:
            f.integer(axis, f"{path}.axis", 0, len(shape) - 1)
        count = 1 if axis is None else shape[axis]
        scale = f.array(spec["scale"], f"{path}.scale", count, count)
        scale = [f.number(s, f"{path}.scale[{i}]", positive=True) for i, s in enumerate(scale)]
        lo, hi = code_range(dtype)
        zero_point = f.integers(spec["zero_point"], f"{path}.zero_point", lo, hi)
        f.require(len(zero_point) == count, f"{path}.zero_point", f"needs {count} entries")
        return QuantParams(tuple(scale), tuple(zero_point), axis)

    def graph(self, spec, path: str, index: int) -> Graph:
        f = self.f
        f.obj(spec, path, GRAPH_KEYS)
        graph = Graph(f.text(spec["name"], f"{path}.name"))
        values: dict[str, Value] = {}

        def define(name: str, where: str) -> None:
            f.require(name not in values, where, f"value name '{name}' is defined twice")

        for i, entry in enumerate(f.array(spec["inputs"], f"{path}.inputs")):
            where = f"{path}.inputs[{i}]"
            name, dtype, shape, quant = self.value_type(entry, where)
            define(name, where)
            values[name] = value = graph.add_input(name, dtype, shape)
            value.quant = quant
        for i, entry in enumerate(f.array(spec["constants"], f"{path}.constants")):
            where = f"{path}.constants[{i}]"
            name, dtype, shape, quant = self.value_type(entry, where, CONSTANT_KEYS)
            define(name, where)
            nbytes = math.prod(shape) * dtype.itemsize
            f.integer(entry["nbytes"], f"{where}.nbytes", nbytes, nbytes)
            offset = f.integer(entry["offset"], f"{where}.offset", 0, self.data_length - nbytes)
            tensor = Tensor.mapped(self.buffer, self.data_offset + offset, dtype, shape)
            values[name] = value = graph.add_constant(tensor, name)
            value.quant = quant
        nodes = f.array(spec["nodes"], f"{path}.nodes")
        names: set[str] = set()
        for i, entry in enumerate(nodes):
            self.node(graph, values, names, entry, f"{path}.nodes[{i}]", define, index)
        outputs = f.array(spec["outputs"], f"{path}.outputs", min_len=1)
        for i, name in enumerate(outputs):
            f.text(name, f"{path}.outputs[{i}]")
            f.require(name in values, f"{path}.outputs[{i}]", f"'{name}' is not defined")
        graph.outputs = [values[name] for name in outputs]
        return graph

    def node(
        self, graph: Graph, values: dict, names: set, entry, path: str, define, index: int
    ) -> None:
        f = self.f
        f.obj(entry, path, NODE_KEYS)
        name = f.text(entry["name"], f"{path}.name")
        f.require(name not in names, f"{path}.name", f"node name '{name}' is used twice")
        names.add(name)
        op = f.choice(f.text(entry["op"], f"{path}.op"), f"{path}.op", sorted(OPS))
        inputs = []
        for j, ref in enumerate(f.array(entry["inputs"], f"{path}.inputs")):
            if ref is not None:
                f.text(ref, f"{path}.inputs[{j}]")
                f.require(ref in values, f"{path}.inputs[{j}]", f"value '{ref}' is not defined")
            inputs.append(None if ref is None else values[ref])
        least, most = arity(op)
        ok = max(least, 1) <= len(inputs) and (most is None or len(inputs) <= most)
        f.require(ok, f"{path}.inputs", f"{op} takes {least}..{most or 'any'} inputs")
        required = inputs if most is None else inputs[:least]
        f.require(None not in required, f"{path}.inputs", f"{op} lacks a required input")
        attrs = f.obj(entry["attrs"], f"{path}.attrs")
        check_attributes(f, op, attrs, inputs, f"{path}.attrs")
        attrs = dict(attrs)
        for key in OPS[op].subgraphs:
            if key in attrs:
                where, last = f"{path}.attrs.{key}", len(self.graphs) - 1
                f.require(index < last, where, "names a subgraph, but no graph follows this one")
                held = f.integer(attrs[key], where, index + 1, last)
                attrs[key] = self.graphs[held]
                self.held.add(held)
        outs = [
            self.value_type(out, f"{path}.outputs[{j}]")
            for j, out in enumerate(f.array(entry["outputs"], f"{path}.outputs", min_len=1))
        ]
        for j, (out_name, *_) in enumerate(outs):
            define(out_name, f"{path}.outputs[{j}].name")
        try:
            node = graph.make_node(op, inputs, attrs, name, [out[0] for out in outs])
        except (*_INFERENCE_ERRORS, IRError) as error:
            raise f.error(path, f"node '{name}' ({op}) is invalid: {error}") from None
        f.require(len(node.outputs) == len(outs), f"{path}.outputs", f"{op} has a different count")
        for j, (value, (out_name, dtype, shape, quant)) in enumerate(zip(node.outputs, outs)):
            if (value.dtype, value.shape, value.name) != (dtype, shape, out_name):
                raise f.error(
                    f"{path}.outputs[{j}]",
                    f"stored {dtypes.name_of(dtype)}{list(shape)} but {op} infers "
                    f"{dtypes.name_of(value.dtype)}{list(value.shape)}",
                )
            value.quant = quant
            values[out_name] = value


_INFERENCE_ERRORS = (ValueError, KeyError, TypeError, IndexError, ArithmeticError, AttributeError)


def ir_digest(model: Model) -> str:
    """The SHA-256 `save_ir` would return for `model`, computed without writing a file."""
    digest = hashlib.sha256()
    for chunk in _chunks(model):
        digest.update(chunk)
    return digest.hexdigest()


def ir_file_digest(path: str | os.PathLike) -> str | None:
    """The SHA-256 an intact IR file at `path` carries in its trailer (what `save_ir` returned
    when it wrote it), or None when the file is missing, not an IR file or corrupt."""
    try:
        with open_regular(path, ANY_SIZE) as handle:
            data = handle.read()
    except (OSError, UserError):
        return None
    body, trailer = data[:-DIGEST], data[-DIGEST:]
    if not data.startswith(MAGIC) or hashlib.sha256(body).digest() != trailer:
        return None
    return trailer.hex()
