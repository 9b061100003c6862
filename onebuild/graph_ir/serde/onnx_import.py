"""ONNX -> IR import, with static shapes.

Nodes are converted in topological order into canonical IR ops (see `onnx_ops` and
`onnx_ops_nn`), each validated first (`onnx_checks`: signature and input types from the
operator schema, then per-op attribute and operand rules), so a malformed model fails with one
line naming the file and the node. A node whose inputs are all constants is evaluated on the
spot, so shape-computing subgraphs (Shape -> Gather -> Concat -> Reshape ...) fold away while
importing, and every IR node gets its output types inferred when it is created. Symbolic dims
(and dims declared 0 or less) are fixed by `input_shapes`; a dynamic batch dim (axis 0)
defaults to 1. Graph output names are kept exactly.
"""

import heapq
import logging
import math
import mmap
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import helper, numpy_helper

from ...errors import DynamicValueError, ModelError, UnsupportedOpsError, UserError
from ...fileio import not_a_file
from .. import dtypes
from ..ir import Graph, Model, Value
from ..quant.from_qdq import fold_qdq
from ..tensor import Tensor
from . import onnx_checks as checks
from . import onnx_ops_index, onnx_ops_nn, onnx_qdq  # noqa: F401  (register their converters)
from .onnx_context import NodeContext
from .onnx_control import WITH_SUBGRAPHS
from .onnx_ops import CONVERTERS, converter_for
from .onnx_wire import map_embedded_weights

log = logging.getLogger("onebuild")

ONNX_DOMAINS = ("", "ai.onnx")
# Other domains whose operators have converters, registered as "<domain>.<op_type>".
EXTRA_DOMAINS = ("com.microsoft",)
MIN_OPSET = 7


def load_onnx(
    path: str | os.PathLike,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    input_values: Mapping[str, np.ndarray] | None = None,
) -> Model:
    """Read and import an ONNX file. External weights are memory-mapped, not copied."""
    path = Path(path)
    if not path.is_file():
        raise not_a_file(path)
    try:
        proto = _read_model(path)
    except (DecodeError, RuntimeWarning, ValueError, OSError) as error:
        raise ModelError(f"{path}: not a valid ONNX model ({error})") from None
    if not proto.HasField("graph") or not (proto.graph.node or proto.graph.output):
        raise ModelError(f"{path}: not a valid ONNX model (no graph)")
    return import_onnx(proto, str(path), input_shapes, input_values, base_dir=path.parent)


def _read_model(path: Path) -> onnx.ModelProto:
    """Parse the model; large embedded weights become references into the file (memory-mapped
    by the importer, never parsed or copied; see onnx_wire)."""
    with open(path, "rb") as handle:
        if not os.fstat(handle.fileno()).st_size:  # an empty file cannot be mapped
            return onnx.ModelProto()
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            stripped = map_embedded_weights(data, path.name)
            return onnx.load_model_from_string(data[:] if stripped is None else stripped)


def import_onnx(
    proto: onnx.ModelProto,
    source: str = "<model>",
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    input_values: Mapping[str, np.ndarray] | None = None,
    base_dir: Path | None = None,
) -> Model:
    """Import an in-memory ONNX model; `input_values` freezes graph inputs to constants."""
    opset = next((o.version for o in proto.opset_import if o.domain in ONNX_DOMAINS), None)
    if opset is None:
        raise ModelError(f"{source}: the model does not import the ONNX operator set")
    if opset < MIN_OPSET:
        raise ModelError(f"{source}: opset {opset} is too old; onebuild reads opset {MIN_OPSET}+")
    importer = _GraphImporter(proto.graph, opset, source, base_dir)
    graph = fold_qdq(importer.run(dict(input_shapes or {}), dict(input_values or {})))
    metadata = {"source_opset": str(opset), "producer": proto.producer_name or ""}
    return Model([graph], metadata)


class _GraphImporter:
    def __init__(self, proto: onnx.GraphProto, opset: int, source: str, base_dir: Path | None):
        self.proto, self.opset, self.source, self.base_dir = proto, opset, source, base_dir
        self.graph = Graph(proto.name or "main")
        self.values: dict[str, Value] = {}
        self._mapped_files: dict[Path, mmap.mmap] = {}

    def run(self, input_shapes: dict, input_values: dict) -> Graph:
        self._check_text()
        nodes = self._sorted_nodes()
        self._check_supported(nodes)
        self._check_definitions(nodes)
        for init in self.proto.initializer:
            try:
                tensor = self.tensor(init)
            except ValueError as error:
                raise ModelError(f"{self.source}: {error}") from None
            self.values[init.name] = self.graph.add_constant(tensor, init.name)
        self._add_inputs(input_shapes, input_values)
        # Values made while converting a node never take a tensor name of the model.
        self.graph.reserve([o for n in nodes for o in n.output if o])
        self.graph.reserve(o.name for o in self.proto.output)
        for node in nodes:
            self._convert(node)
        self._set_outputs()
        return self.graph

    # -- structure ---------------------------------------------------------------------------
    def _check_text(self) -> None:
        """Names and op types must be text (protobuf hands back bytes for invalid UTF-8)."""
        graph = self.proto
        names = [v.name for v in (*graph.input, *graph.output, *graph.initializer)]
        for node in graph.node:
            names += [node.op_type, node.name, node.domain, *node.input, *node.output]
        if not all(isinstance(name, str) for name in names):
            raise ModelError(f"{self.source}: corrupt model (a name is not valid UTF-8 text)")

    def _sorted_nodes(self, nodes=None) -> list[onnx.NodeProto]:
        """ONNX nodes (of the graph, or of a subgraph) in a stable topological order (models
        should be sorted; some are not); names defined outside them count as given."""
        nodes = list(self.proto.node if nodes is None else nodes)
        producer = {out: i for i, n in enumerate(nodes) for out in n.output if out}
        waiting = [
            {producer[name] for name in n.input if producer.get(name, i) != i}
            for i, n in enumerate(nodes)
        ]
        readers: dict[int, list[int]] = {}
        for i, deps in enumerate(waiting):
            for dep in deps:
                readers.setdefault(dep, []).append(i)
        ready = [i for i, deps in enumerate(waiting) if not deps]
        heapq.heapify(ready)
        order = []
        while ready:
            index = heapq.heappop(ready)
            order.append(nodes[index])
            for reader in readers.get(index, []):
                waiting[reader].discard(index)
                if not waiting[reader]:
                    heapq.heappush(ready, reader)
        if len(order) != len(nodes):
            stuck = next(n for i, n in enumerate(nodes) if waiting[i])
            raise ModelError(f"{self.source}: the graph has a cycle through node '{stuck.name}'")
        return order

    def _check_definitions(self, nodes: list[onnx.NodeProto]) -> None:
        """Every tensor name is defined once (ONNX graphs are in SSA form)."""
        defined: dict[str, str] = {}
        for init in self.proto.initializer:
            if init.name in defined:
                raise ModelError(f"{self.source}: initializer '{init.name}' is defined twice")
            defined[init.name] = "an initializer"
        for info in self.proto.input:
            if info.name in defined and defined[info.name] != "an initializer":
                raise ModelError(f"{self.source}: graph input '{info.name}' is listed twice")
            defined.setdefault(info.name, "a graph input")
        for i, node in enumerate(nodes):
            for name in node.output:
                if name in defined:
                    raise ModelError(
                        f"{self.source}: node '{node.name or f'#{i}'}' ({node.op_type}) writes "
                        f"'{name}', which {defined[name]} already defines"
                    )
                if name:
                    defined[name] = f"node '{node.name or f'#{i}'}'"

    def _check_supported(self, nodes: list[onnx.NodeProto]) -> None:
        unsupported = _unsupported_ops(nodes, "")
        if unsupported:
            raise UnsupportedOpsError(self.source, unsupported)

    def _add_inputs(self, input_shapes: dict, input_values: dict) -> None:
        names = [i.name for i in self.proto.input if i.name not in self.values]
        for name in list(input_shapes) + list(input_values):
            if name not in names:
                raise UserError(
                    f"{self.source}: the model has no input '{name}' (inputs: {', '.join(names)})"
                )
        for info in self.proto.input:
            if info.name in self.values:  # an initializer listed as input (IR version < 4)
                continue
            if info.name in input_values:
                array = self._pinned(info, input_values[info.name], input_shapes.get(info.name))
                self.values[info.name] = self.graph.add_constant(array, info.name)
                continue
            dtype, shape = self._value_type(info, input_shapes.get(info.name))
            self.values[info.name] = self.graph.add_input(info.name, dtype, shape)

    def _pinned(self, info: onnx.ValueInfoProto, value, shape) -> np.ndarray:
        """A value pinning an input: of the input's type, broadcast to its declared shape."""
        dtype = self.dtype(info.type.tensor_type.elem_type, f"input '{info.name}'")
        try:
            array = np.asarray(value, dtype=dtype)
            dims = info.type.tensor_type.shape.dim
            declared = shape or [_fixed_dim(d) for d in dims]
            if None not in declared and list(array.shape) != list(declared):
                array = np.broadcast_to(array, declared).copy()
        except (ValueError, TypeError) as error:
            raise UserError(
                f"{self.source}: the constant given for input '{info.name}' does not fit its "
                f"type {dtype}{[_fixed_dim(d) for d in info.type.tensor_type.shape.dim]}: {error}"
            ) from None
        return array

    def _value_type(self, info: onnx.ValueInfoProto, override: Sequence[int] | None):
        kind = info.type.WhichOneof("value")
        if kind != "tensor_type":
            raise ModelError(f"{self.source}: input '{info.name}' is a {kind}, not a tensor")
        tensor_type = info.type.tensor_type
        dtype = self.dtype(tensor_type.elem_type, f"input '{info.name}'")
        dims = tensor_type.shape.dim if tensor_type.HasField("shape") else None
        if override is not None:
            override = [int(d) for d in override]
            if dims is not None and len(dims) != len(override):
                raise UserError(
                    f"{self.source}: input_shapes gives '{info.name}' rank {len(override)}, "
                    f"the model declares rank {len(dims)}"
                )
            for axis, new in enumerate(override):
                if new < 0:
                    raise UserError(
                        f"{self.source}: input_shapes sets '{info.name}' axis {axis} to {new}; "
                        "sizes must not be negative"
                    )
            for axis, (dim, new) in enumerate(zip(dims or [], override)):
                fixed = _fixed_dim(dim)
                if fixed is not None and fixed != new:
                    raise UserError(
                        f"{self.source}: input_shapes sets '{info.name}' axis {axis} to {new}, "
                        f"but the model fixes it to {fixed}"
                    )
            return dtype, tuple(override)
        if dims is None:
            raise ModelError(
                f"{self.source}: input '{info.name}' has no shape; give it with input_shapes"
            )
        shape = []
        for axis, dim in enumerate(dims):
            fixed = _fixed_dim(dim)
            if fixed is not None:
                shape.append(fixed)
            elif axis == 0:
                log.warning(
                    "input '%s': dynamic batch dim set to 1 (change it with import.input_shapes "
                    "in a recipe, --input-shape on the command line)",
                    info.name,
                )
                shape.append(1)
            else:
                label = dim.dim_param or (str(dim.dim_value) if dim.HasField("dim_value") else "?")
                raise ModelError(
                    f"{self.source}: input '{info.name}' has dynamic dim '{label}' on axis {axis};"
                    f" fix it with import.input_shapes, e.g. {{ {info.name} = [...] }} in a "
                    f"recipe, or --input-shape {info.name}=... on the command line"
                )
        return dtype, tuple(shape)

    def _set_outputs(self) -> None:
        """Graph outputs keep their names exactly (listed twice, an output is one value twice,
        as in onnxruntime)."""
        for info in self.proto.output:
            value = self.values.get(info.name)
            if value is None:
                raise ModelError(f"{self.source}: graph output '{info.name}' is never produced")
            if value.name != info.name or value.is_const:
                # A constant or an alias: give the output its own node, under the exact name.
                if value.name == info.name:
                    self.graph.rename(value, f"{info.name}_value")
                value = self.graph.make_node("Identity", [value], name=info.name).output
                self.graph.rename(value, info.name)
                self.values[info.name] = value
            self.graph.outputs.append(value)

    # -- tensors -----------------------------------------------------------------------------
    def dtype(self, elem_type: int, what: str) -> np.dtype:
        try:
            return dtypes.dtype(dtypes.name_of(helper.tensor_dtype_to_np_dtype(elem_type)))
        except (ValueError, KeyError, TypeError):
            known = elem_type in onnx.TensorProto.DataType.values()
            name = onnx.TensorProto.DataType.Name(elem_type) if known else f"#{elem_type}"
            raise ModelError(f"{self.source}: {what} has unsupported element type {name}") from None

    def tensor(self, proto: onnx.TensorProto) -> Tensor:
        """An initializer's or attribute's tensor; ValueError naming it if it is malformed."""
        dtype = self.dtype(proto.data_type, f"tensor '{proto.name}'")
        shape = checks.dims(proto.dims, f"tensor '{proto.name}'")
        if proto.data_location == onnx.TensorProto.EXTERNAL:
            return self._external_tensor(proto, dtype, shape)
        try:
            array = numpy_helper.to_array(proto)
        except Exception as error:
            raise ValueError(f"tensor '{proto.name}' is corrupt ({error})") from None
        return Tensor(np.asarray(array, dtype=dtype))

    def _external_tensor(self, proto: onnx.TensorProto, dtype: np.dtype, shape) -> Tensor:
        what = f"tensor '{proto.name}'"
        info = {entry.key: entry.value for entry in proto.external_data}
        location, offset, length = checks.external_data(info, what)
        base = Path(self.base_dir or Path.cwd()).resolve()
        try:
            path = (base / location).resolve()
        except (OSError, RuntimeError):  # a symlink loop (Python 3.11 raises RuntimeError)
            path = base
        if not location or base not in path.parents or not path.is_file():
            raise ValueError(
                f"{what} refers to external data '{location}' that is missing or outside the "
                "model's folder"
            )
        nbytes = math.prod(shape) * dtype.itemsize
        if length is not None and length != nbytes:
            raise ValueError(
                f"{what} has {length} data bytes, its shape {list(shape)} needs {nbytes}"
            )
        if path not in self._mapped_files:
            with open(path, "rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                self._mapped_files[path] = (
                    mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
                )
        buffer = self._mapped_files[path]
        if offset + nbytes > len(buffer):
            raise ValueError(
                f"{what}: external data file '{path.name}' has {len(buffer)} bytes, the tensor "
                f"needs {nbytes} at offset {offset}"
            )
        return Tensor.mapped(buffer, offset, dtype, shape)

    # -- nodes -------------------------------------------------------------------------------
    def _convert(self, node: onnx.NodeProto) -> None:
        if node.op_type in WITH_SUBGRAPHS and node.domain in ONNX_DOMAINS:
            checks.signature(node, self.opset)
            return WITH_SUBGRAPHS[node.op_type](self, node)
        ctx = NodeContext(self, node)
        try:
            checks.signature(node, self.opset)
            checks.input_types(node, self.opset, [v and v.dtype for v in ctx.inputs])
            results = converter_of(node)(ctx)
        except (DynamicValueError, UserError):
            raise
        except (ValueError, KeyError, IndexError, TypeError, ArithmeticError) as error:
            raise ModelError(
                f"{self.source}: node '{ctx.name}' ({node.op_type}): {error}"
            ) from None
        except MemoryError:  # a constant it computes (Range, ConstantOfShape, ...) is too big
            raise ModelError(
                f"{self.source}: node '{ctx.name}' ({node.op_type}): out of memory computing "
                "its constant output"
            ) from None
        wanted = [name for name in node.output]
        for name, value in zip(wanted, results):
            if not name:
                continue
            if value.graph is self.graph and value.name != name and ctx.created(value):
                self.graph.rename(value, name)
            self.values[name] = value


def converter_of(node: onnx.NodeProto) -> Callable | None:
    """The converter of a node (None: not supported); operators of EXTRA_DOMAINS are
    registered as "<domain>.<op_type>"."""
    if node.domain in ONNX_DOMAINS:
        return converter_for(node.op_type)
    return CONVERTERS.get(f"{node.domain}.{node.op_type}") if node.domain in EXTRA_DOMAINS else None


def _unsupported_ops(nodes, where: str) -> list[tuple[str, str, str]]:
    """(op, node name, where) of every node onebuild cannot convert, in subgraphs too (If
    branches, Loop and Scan bodies, recursively); `where` is the path to the subgraph, e.g.
    "If 'cond'.then_branch", empty in the main graph."""
    found = []
    for i, node in enumerate(nodes):
        name = node.name or next((o for o in node.output if o), f"#{i}")  # as NodeContext
        subgraphs = [
            (a.name, graph)
            for a in node.attribute
            if a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
            for graph in ([a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs)
        ]
        foldable = node.op_type in WITH_SUBGRAPHS and node.domain in ONNX_DOMAINS
        if converter_of(node) is None and not foldable:
            op = node.op_type if node.domain in ONNX_DOMAINS else f"{node.domain}.{node.op_type}"
            found.append((op, name, where))
        elif subgraphs and not foldable:
            found.append((f"{node.op_type} with subgraphs", name, where))
        for attr, graph in subgraphs:
            inner = f"{node.op_type} '{name}'.{attr}"
            found += _unsupported_ops(graph.node, f"{where} / {inner}" if where else inner)
    return found


def _fixed_dim(dim: onnx.TensorShapeProto.Dimension) -> int | None:
    """A declared dim's size, or None when it is dynamic: symbolic, missing, or a dim_value of
    0 or less (exporters write -1, and sometimes 0, for "unknown")."""
    return dim.dim_value if dim.HasField("dim_value") and dim.dim_value > 0 else None
