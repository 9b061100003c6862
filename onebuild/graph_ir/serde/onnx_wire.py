"""Memory-map the weights embedded in an ONNX file instead of parsing them into memory.

Parsing a model with embedded weights holds the file's bytes and the parsed copy at once, and
converting the tensors to arrays copies them again. Instead, the protobuf wire format is walked
(ModelProto.graph -> GraphProto.initializer -> TensorProto.raw_data) and a small copy of the
model is written where each large `raw_data` field becomes an external-data reference to its
own bytes inside the model file (location = the file's name, offset, length), which the
importer memory-maps like any external data. Only field framing is interpreted; anything
unexpected returns None and the caller parses the file normally.
"""

import os

MODEL_GRAPH, GRAPH_INITIALIZER = 7, 5
TENSOR_RAW_DATA, TENSOR_EXTERNAL_DATA, TENSOR_DATA_LOCATION = 9, 13, 14
LENGTH_DELIMITED, VARINT, FIXED64, FIXED32 = 2, 0, 1, 5
EXTERNAL = 1


class _Malformed(Exception):
    pass


def _varint(data, at: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if at >= len(data) or shift > 63:
            raise _Malformed
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if byte < 0x80:
            return value, at


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _fields(data, start: int, end: int):
    """(field number, wire type, field start, payload start, payload end) of each field."""
    at = start
    while at < end:
        tag, payload = _varint(data, at)
        number, wire = tag >> 3, tag & 7
        if wire == VARINT:
            _, stop = _varint(data, payload)
        elif wire == LENGTH_DELIMITED:
            length, payload = _varint(data, payload)
            stop = payload + length
        elif wire == FIXED64:
            stop = payload + 8
        elif wire == FIXED32:
            stop = payload + 4
        else:  # groups: not used by ONNX
            raise _Malformed
        if stop > end:
            raise _Malformed
        yield number, wire, at, payload, stop
        at = stop


def _length_field(number: int, payload: bytes) -> bytes:
    return _encode_varint(number << 3 | LENGTH_DELIMITED) + _encode_varint(len(payload)) + payload


def _entry(key: str, value: str) -> bytes:
    return _length_field(1, key.encode()) + _length_field(2, value.encode())


class _Rewriter:
    def __init__(self, data, location: str, min_bytes: int):
        self.data, self.location, self.min_bytes = data, location, min_bytes
        self.mapped = 0

    def message(self, start: int, end: int, rewrite: dict) -> bytes:
        """The message in data[start:end] with the length-delimited fields named in `rewrite`
        replaced by what their handler returns."""
        out = bytearray()
        for number, wire, field, payload, stop in _fields(self.data, start, end):
            handler = rewrite.get(number) if wire == LENGTH_DELIMITED else None
            if handler is None:
                out += self.data[field:stop]
            else:
                out += _length_field(number, handler(payload, stop))
        return bytes(out)

    def graph(self, start: int, end: int) -> bytes:
        return self.message(start, end, {GRAPH_INITIALIZER: self.tensor})

    def tensor(self, start: int, end: int) -> bytes:
        fields = list(_fields(self.data, start, end))
        raw = [(p, s) for n, w, _, p, s in fields if n == TENSOR_RAW_DATA and w == LENGTH_DELIMITED]
        if len(raw) != 1 or raw[0][1] - raw[0][0] < self.min_bytes:
            return bytes(self.data[start:end])
        offset, stop = raw[0]
        self.mapped += 1
        kept = b"".join(bytes(self.data[f:s]) for n, _, f, _, s in fields if n != TENSOR_RAW_DATA)
        reference = b"".join(
            _length_field(TENSOR_EXTERNAL_DATA, _entry(key, value))
            for key, value in (
                ("location", self.location),
                ("offset", str(offset)),
                ("length", str(stop - offset)),
            )
        )
        location = _encode_varint(TENSOR_DATA_LOCATION << 3 | VARINT) + bytes([EXTERNAL])
        return kept + reference + location


def map_embedded_weights(data, location: str, min_bytes: int = 1 << 16) -> bytes | None:
    """The serialized model `data` (bytes or an mmap of the file named `location`) with every
    initializer's raw_data of at least `min_bytes` turned into a reference into that file;
    None when there is nothing to map or the bytes are not a well-formed model."""
    rewriter = _Rewriter(data, location, min_bytes)
    try:
        model = rewriter.message(0, len(data), {MODEL_GRAPH: rewriter.graph})
    except _Malformed:
        return None
    return model if rewriter.mapped else None


GRAPH_NODE, NODE_OP_TYPE = 1, 4
QUANTIZED_OPS = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "ConvInteger",
                 "MatMulInteger", "QLinear")  # fmt: skip


def quantized_onnx(path) -> bool:
    """Whether the ONNX file at `path` states quantization in its main graph (QDQ, QOperator
    or dynamic ops): read from the nodes' framing, the weights are not parsed. False for any
    file that is not a well-formed model (its import says what is wrong)."""
    import mmap

    try:
        with (
            open(path, "rb") as handle,
            mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as m,
        ):
            graphs = [(p, s) for n, _, _, p, s in _fields(m, 0, len(m)) if n == MODEL_GRAPH]
            nodes = [(p, s) for n, _, _, p, s in _fields(m, *graphs[0]) if n == GRAPH_NODE]
            for start, end in nodes:
                op = [
                    bytes(m[p:s]) for n, _, _, p, s in _fields(m, start, end) if n == NODE_OP_TYPE
                ]
                if op and op[0].decode(errors="replace").startswith(QUANTIZED_OPS):
                    return True
    except (OSError, ValueError, IndexError, _Malformed):
        return False
    return False


GRAPH_SPARSE_INITIALIZER, NODE_ATTRIBUTE, MODEL_FUNCTIONS, FUNCTION_NODE = 15, 5, 25, 7
ATTRIBUTE_TENSORS, ATTRIBUTE_SPARSE, ATTRIBUTE_GRAPHS = (5, 10), (22, 23), (6, 11)
MAX_NESTING = 64  # subgraphs inside subgraphs: deeper is not a model anyone exported


class _Locations:
    """The external-data locations of every tensor of a serialized model (initializers, sparse
    initializers, attribute tensors; subgraphs and functions included), as onnx's
    `external_data_helper` walks them."""

    def __init__(self, data):
        self.data, self.found = data, {}

    def fields(self, span: tuple[int, int]):
        return ((n, p, s) for n, w, _, p, s in _fields(self.data, *span) if w == LENGTH_DELIMITED)

    def model(self) -> None:
        for number, start, stop in self.fields((0, len(self.data))):
            if number == MODEL_GRAPH:
                self.graph((start, stop), 0)
            elif number == MODEL_FUNCTIONS:
                for n, p, s in self.fields((start, stop)):
                    if n == FUNCTION_NODE:
                        self.node((p, s), 0)

    def graph(self, span: tuple[int, int], depth: int) -> None:
        if depth > MAX_NESTING:
            raise _Malformed
        for number, start, stop in self.fields(span):
            if number == GRAPH_INITIALIZER:
                self.tensor((start, stop))
            elif number == GRAPH_SPARSE_INITIALIZER:
                self.sparse((start, stop))
            elif number == GRAPH_NODE:
                self.node((start, stop), depth)

    def node(self, span: tuple[int, int], depth: int) -> None:
        attributes = [(start, stop) for n, start, stop in self.fields(span) if n == NODE_ATTRIBUTE]
        for attribute in attributes:
            for number, start, stop in self.fields(attribute):
                if number in ATTRIBUTE_TENSORS:
                    self.tensor((start, stop))
                elif number in ATTRIBUTE_SPARSE:
                    self.sparse((start, stop))
                elif number in ATTRIBUTE_GRAPHS:
                    self.graph((start, stop), depth + 1)

    def sparse(self, span: tuple[int, int]) -> None:
        for _, start, stop in self.fields(span):  # values (1) and indices (2): tensors
            self.tensor((start, stop))

    def tensor(self, span: tuple[int, int]) -> None:
        external, location = False, ""
        for number, wire, _, start, stop in _fields(self.data, *span):
            if number == TENSOR_DATA_LOCATION and wire == VARINT:
                external = _varint(self.data, start)[0] == EXTERNAL
            elif number == TENSOR_EXTERNAL_DATA and wire == LENGTH_DELIMITED:
                entry = {n: bytes(self.data[p:s]) for n, p, s in self.fields((start, stop))}
                if entry.get(1) == b"location":
                    location = entry.get(2, b"").decode(errors="replace")
        if external and location:
            self.found.setdefault(location)


def external_data_files(path, existing: bool = True) -> list:
    """The files beside the ONNX model at `path` that its tensors keep their data in (as Paths,
    sorted): those inside the model's folder (that exist, with `existing`), the only ones its
    import reads (it refuses the others, naming them). Read from the framing, the weights are
    not parsed; empty for a file that is not a well-formed model (its import says what is
    wrong)."""
    import mmap
    from pathlib import Path

    try:
        with open(path, "rb") as handle:
            if not os.fstat(handle.fileno()).st_size:
                return []
            with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
                walk = _Locations(data)
                walk.model()
    except (OSError, ValueError, _Malformed):
        return []
    base = Path(path).parent.resolve()
    files = set()
    for location in walk.found:
        try:
            files.add((base / location).resolve())
        except (OSError, RuntimeError, ValueError):  # NUL, a symlink loop (3.11: RuntimeError)
            continue
    return sorted(f for f in files if base in f.parents and (f.is_file() or not existing))
