"""The .tvn file format (docs/tvn-format.md): encode a `Module`, decode and validate one.

Layout (little-endian): a 16-byte header (magic, version, section count, reserved), a section
table (kind, offset, size per section), the sections, and a SHA-256 of everything before it.
Sections: META (JSON), IO (binary segment table), LAYERS (JSON: tensors and layer parameters,
arrays referenced into the BLOB), CODE (fixed-size instruction records), BLOB (constants).
The decoder checks the checksum first, then every count, offset and size against the bytes it
has, before allocating or using anything; any violation is a one-line FormatError.
"""

import hashlib
import json
import os
import struct
from pathlib import Path

import numpy as np

from ...errors import FormatError
from ...fileio import atomic_write_bytes
from .codegen import EXEC, LOAD, STORE, Module, align
from .lower import WINDOWED, Layer, TensorDesc, chw

MAGIC = b"TVN\0"
VERSION = 1
HEADER = struct.Struct("<4sHHII")  # magic, version, flags, section count, reserved
SECTION = struct.Struct("<IIQQ")  # kind, reserved, offset, size
IO_ENTRY = struct.Struct(
    "<BBBB4IdiQQH"
)  # dir, dtype, layout, rank, dims, scale, zp, dram, size, name
RECORD = 40  # 10 x uint32 per instruction
META, IO, LAYERS, CODE, BLOB = 1, 2, 3, 4, 5
KINDS = {META: "META", IO: "IO", LAYERS: "LAYERS", CODE: "CODE", BLOB: "BLOB"}
DTYPES = ["uint8", "int8", "int16", "int32", "int64", "float64"]
LAYER_KINDS = {"conv", "gemm", "add", "mul", "avgpool", "maxpool", "lookup", "requant", "concat"}
LAYER_KINDS |= {"reshape"}
DIGEST = 32
MAX_ARENA = 1 << 30


# -- encoding --------------------------------------------------------------------------------
def _io_section(module: Module) -> bytes:
    entries = [(0, n) for n in module.inputs] + [(1, n) for n in module.outputs]
    parts = [struct.pack("<I", len(entries))]
    for direction, name in entries:
        t = module.tensors[name]
        dims = list(t.dims) + [1] * (4 - len(t.dims))
        encoded = name.encode()
        parts.append(
            IO_ENTRY.pack(
                direction,
                DTYPES.index(t.dtype),
                0,  # NCHW
                len(t.dims),
                *dims,
                t.scale,
                t.zero_point,
                module.dram[name],
                t.nbytes,
                len(encoded),
            )
        )
        parts.append(encoded)
    return b"".join(parts)


def _layers_section(module: Module) -> bytes:
    layers = []
    for index, layer in enumerate(module.layers):
        arrays = {
            name: [module.arrays[(index, name)], array.dtype.name, list(array.shape)]
            for name, array in sorted(layer.arrays.items())
        }
        layers.append(
            {
                "kind": layer.kind,
                "name": layer.name,
                "inputs": layer.inputs,
                "output": layer.output,
                "attrs": layer.attrs,
                "arrays": arrays,
            }
        )
    tensors = {
        name: {
            "dims": list(t.dims),
            "dtype": t.dtype,
            "scale": t.scale,
            "zero_point": t.zero_point,
            "dram": module.dram[name],
        }
        for name, t in sorted(module.tensors.items())
    }
    body = {
        "tensors": tensors,
        "layers": layers,
        "inputs": module.inputs,
        "outputs": module.outputs,
        "arena_bytes": module.arena_bytes,
        "sram_peak": module.sram_peak,
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def encode(module: Module) -> bytes:
    sections = [
        (META, json.dumps(module.meta, sort_keys=True, separators=(",", ":")).encode()),
        (IO, _io_section(module)),
        (LAYERS, _layers_section(module)),
        (CODE, np.ascontiguousarray(module.code, dtype="<u4").tobytes()),
        (BLOB, module.blob),
    ]
    offset = align(HEADER.size + SECTION.size * len(sections))
    table, body = [], b""
    for kind, data in sections:
        table.append(SECTION.pack(kind, 0, offset + len(body), len(data)))
        body += data + b"\0" * (align(len(data)) - len(data))
    head = HEADER.pack(MAGIC, VERSION, 0, len(sections), 0) + b"".join(table)
    head += b"\0" * (offset - len(head))
    content = head + body
    return content + hashlib.sha256(content).digest()


def save_tvn(module: Module, path: str | os.PathLike) -> None:
    atomic_write_bytes(path, encode(module))


# -- decoding --------------------------------------------------------------------------------
class _Reader:
    def __init__(self, data: bytes, where: str):
        self.data, self.where = data, where

    def fail(self, message: str) -> FormatError:
        return FormatError(f"{self.where}: not a valid .tvn file: {message}")


def _sections(r: _Reader) -> dict[int, bytes]:
    data = r.data
    if len(data) < HEADER.size + DIGEST or data[:4] != MAGIC:
        raise r.fail("bad magic or too short")
    content, digest = data[:-DIGEST], data[-DIGEST:]
    if hashlib.sha256(content).digest() != digest:
        raise r.fail("checksum mismatch (corrupt or truncated)")
    _, version, _, count, _ = HEADER.unpack_from(content)
    if version != VERSION:
        raise r.fail(f"version {version} is not supported (this onebuild reads {VERSION})")
    if count > len(KINDS) or HEADER.size + count * SECTION.size > len(content):
        raise r.fail(f"section count {count} is out of range")
    sections = {}
    for i in range(count):
        kind, _, offset, size = SECTION.unpack_from(content, HEADER.size + i * SECTION.size)
        if kind not in KINDS or kind in sections:
            raise r.fail(f"unknown or repeated section kind {kind}")
        if offset + size > len(content) or offset < HEADER.size:
            raise r.fail(f"section {KINDS[kind]} [{offset}, {offset + size}) is out of bounds")
        sections[kind] = content[offset : offset + size]
    missing = set(KINDS) - set(sections)
    if missing:
        raise r.fail(f"missing section(s) {', '.join(KINDS[k] for k in sorted(missing))}")
    return sections


def _json(r: _Reader, data: bytes, what: str):
    try:
        return json.loads(data.decode())
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise r.fail(f"{what} is not valid JSON ({error})") from None


def _io(r: _Reader, data: bytes) -> list[tuple]:
    if len(data) < 4:
        raise r.fail("I/O table is truncated")
    (count,) = struct.unpack_from("<I", data)
    if count > len(data) // IO_ENTRY.size:
        raise r.fail(f"I/O entry count {count} is out of range")
    entries, at = [], 4
    for _ in range(count):
        if at + IO_ENTRY.size > len(data):
            raise r.fail("I/O table is truncated")
        fields = IO_ENTRY.unpack_from(data, at)
        at += IO_ENTRY.size
        length = fields[-1]
        if at + length > len(data):
            raise r.fail("I/O name is out of bounds")
        try:
            name = data[at : at + length].decode()
        except UnicodeDecodeError:
            raise r.fail("I/O name is not UTF-8") from None
        at += length
        entries.append((*fields[:-1], name))
    return entries


def _check(r: _Reader, condition: bool, message: str) -> None:
    if not condition:
        raise r.fail(message)


def _tensor(r: _Reader, name: str, spec) -> tuple[TensorDesc, int]:
    _check(r, isinstance(spec, dict), f"tensor '{name}' is not an object")
    dims, dtype = spec.get("dims"), spec.get("dtype")
    _check(r, dtype in DTYPES[:3], f"tensor '{name}' has dtype {dtype!r}")
    _check(
        r,
        isinstance(dims, list) and 1 <= len(dims) <= 4 and all(
            isinstance(d, int) and 1 <= d <= 1 << 20 for d in dims
        ),
        f"tensor '{name}' has dims {dims!r}",
    )  # fmt: skip
    scale, zp, dram = spec.get("scale"), spec.get("zero_point"), spec.get("dram")
    _check(r, isinstance(scale, float) and scale > 0, f"tensor '{name}' has scale {scale!r}")
    _check(r, isinstance(zp, int) and isinstance(dram, int) and dram >= 0, f"tensor '{name}'")

    return TensorDesc(name, chw(tuple(dims)), tuple(dims), dtype, scale, zp), dram


def decode(data: bytes, where: str = "<bytes>") -> Module:
    """A validated module; every offset and size is checked against the file and the DRAM."""
    r = _Reader(bytes(data), where)
    sections = _sections(r)
    meta = _json(r, sections[META], "META")
    body = _json(r, sections[LAYERS], "LAYERS")
    _check(r, isinstance(meta, dict) and isinstance(body, dict), "META/LAYERS are not objects")
    blob = sections[BLOB]
    code_bytes = sections[CODE]
    _check(r, len(code_bytes) % RECORD == 0, "CODE size is not a whole number of records")
    code = np.frombuffer(code_bytes, dtype="<u4").reshape(-1, 10).astype(np.uint32)
    tensors, dram = {}, {}
    specs = body.get("tensors")
    _check(r, isinstance(specs, dict), "LAYERS has no tensor table")
    for name, spec in specs.items():
        tensors[name], dram[name] = _tensor(r, name, spec)
    arena = body.get("arena_bytes")
    _check(r, isinstance(arena, int) and 0 <= arena <= MAX_ARENA, f"arena size {arena!r}")
    dram_size = align(len(blob)) + arena
    for name, t in tensors.items():
        _check(r, dram[name] + t.nbytes <= dram_size, f"tensor '{name}' lies outside the DRAM")
    layers, arrays = [], {}
    raw_layers = body.get("layers")
    _check(r, isinstance(raw_layers, list), "LAYERS has no layer list")
    for index, raw in enumerate(raw_layers):
        layers.append(_layer(r, index, raw, tensors, blob, arrays))
    inputs, outputs = body.get("inputs"), body.get("outputs")
    for names in (inputs, outputs):
        _check(r, isinstance(names, list) and all(n in tensors for n in names), "bad I/O names")
    io = _io(r, sections[IO])
    _check(r, [e[-1] for e in io] == [*inputs, *outputs], "I/O table does not match LAYERS")
    sram_peak = body.get("sram_peak")
    _check(r, isinstance(sram_peak, int) and sram_peak >= 0, "bad SRAM peak")
    outs = np.array([tensors[layer.output].shape for layer in layers], np.int64).reshape(-1, 3)
    _validate_code(r, code, outs, dram_size)
    return Module(
        meta, tensors, dram, layers, arrays, blob, code, inputs, outputs, arena, sram_peak
    )


def _layer(r: _Reader, index: int, raw, tensors, blob: bytes, arrays: dict) -> Layer:
    _check(r, isinstance(raw, dict), f"layer {index} is not an object")
    kind, name = raw.get("kind"), raw.get("name")
    _check(r, kind in LAYER_KINDS and isinstance(name, str), f"layer {index} kind {kind!r}")
    ins, out = raw.get("inputs"), raw.get("output")
    _check(
        r,
        isinstance(ins, list) and ins and all(i in tensors for i in ins) and out in tensors,
        f"layer '{name}' refers to unknown tensors",
    )
    attrs = raw.get("attrs")
    _check(
        r,
        isinstance(attrs, dict) and all(map(_small_ints, attrs.values())),
        f"layer '{name}' attrs",
    )
    loaded = {}
    specs = raw.get("arrays")
    _check(r, isinstance(specs, dict), f"layer '{name}' arrays")
    for key, spec in specs.items():
        ok = isinstance(spec, list) and len(spec) == 3 and spec[1] in DTYPES
        ok = ok and isinstance(spec[0], int) and isinstance(spec[2], list)
        ok = ok and all(isinstance(d, int) and 0 <= d <= 1 << 28 for d in spec[2])
        _check(r, ok, f"layer '{name}' array '{key}' is malformed")
        offset, dtype, shape = spec
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        _check(r, offset >= 0 and offset + nbytes <= len(blob), f"array '{key}' out of bounds")
        array = np.frombuffer(blob, dtype=dtype, count=nbytes // np.dtype(dtype).itemsize,
                              offset=offset)  # fmt: skip
        loaded[key] = array.reshape(shape) if shape else array.reshape(())
        arrays[(index, key)] = offset
    layer = Layer(kind, name, ins, out, attrs, loaded)
    _check_layer(r, layer, tensors)
    return layer


def _small_ints(value) -> bool:
    """An attribute: an int or a (nested) list of ints, all of sane magnitude."""
    if isinstance(value, list):
        return len(value) <= 1024 and all(map(_small_ints, value))
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) < 1 << 40


REQUIRED = {
    "conv": ({"kernel", "strides", "dilations", "pads", "group", "x_zero_point"},
             {"weights", "bias", "multiplier", "shift"}),
    "gemm": ({"x_zero_point"}, {"weights", "bias", "multiplier", "shift"}),
    "add": ({"a_zero_point", "b_zero_point", "multiplier", "shift", "a_rescale", "b_rescale",
             "subtract"}, set()),
    "mul": ({"a_zero_point", "b_zero_point", "multiplier", "shift"}, set()),
    "avgpool": ({"kernel", "strides", "dilations", "pads", "count_include_pad", "x_zero_point"},
                {"ratio"}),
    "maxpool": ({"kernel", "strides", "dilations", "pads"}, set()),
    "lookup": (set(), {"table"}),
    "requant": ({"x_zero_point", "multiplier", "shift"}, set()),
    "concat": ({"x_zero_points", "multiplier", "shift"}, set()),
    "reshape": (set(), set()),
}  # fmt: skip
OUTPUT_ATTRS = {"y_zero_point", "qmin", "qmax"}


def _check_layer(r: _Reader, layer: Layer, tensors) -> None:
    attrs, arrays = REQUIRED[layer.kind]
    if layer.kind not in ("maxpool", "lookup", "reshape"):
        attrs = attrs | OUTPUT_ATTRS
    _check(r, attrs <= set(layer.attrs), f"layer '{layer.name}' misses attributes")
    _check(r, arrays <= set(layer.arrays), f"layer '{layer.name}' misses arrays")
    out = tensors[layer.output].shape
    if layer.kind in WINDOWED:
        fits = _window_fits(layer.attrs, tensors[layer.inputs[0]].shape, out)
        _check(r, fits, f"layer '{layer.name}' window attributes do not match its tensors")
    if layer.kind == "conv":
        w = layer.arrays["weights"]
        ok = w.ndim == 4 and w.shape[0] == out[0] and layer.attrs["group"] >= 1
        for key in ("bias", "multiplier", "shift"):
            ok = ok and layer.arrays[key].shape == (out[0],)
        _check(r, ok, f"layer '{layer.name}' weights do not match its output")
    if layer.kind == "gemm":
        w = layer.arrays["weights"]
        _check(r, w.ndim == 2 and w.shape[0] == out[0], f"layer '{layer.name}' weights")
    if layer.kind == "lookup":
        x = tensors[layer.inputs[0]]
        size = 1 << (8 * np.dtype(x.dtype).itemsize)
        _check(r, layer.arrays["table"].shape == (size,), f"layer '{layer.name}' table size")
    if "operand" in layer.arrays:
        ok = layer.attrs.get("const_index") in (0, 1) and len(layer.inputs) == 1
        _check(r, ok and layer.arrays["operand"].shape == (out[0],), f"layer '{layer.name}'")
    elif layer.kind in ("add", "mul"):
        _check(r, len(layer.inputs) == 2, f"layer '{layer.name}' needs two inputs")
    if "shift" in layer.arrays:
        shifts = layer.arrays["shift"]
        _check(r, bool(np.all((shifts >= 1) & (shifts <= 62))), f"layer '{layer.name}' shifts")


def _window_fits(attrs: dict, x: tuple[int, ...], out: tuple[int, ...]) -> bool:
    """Kernel, strides and dilations in [1, 255], pads in [0, 255], and every output row and
    column's window starting inside the padded input (so a tile's input span stays bounded)."""
    sizes = [attrs[key] for key in ("kernel", "strides", "dilations")]
    pads = attrs["pads"]

    def ints(value, count: int, low: int) -> bool:
        return (
            isinstance(value, list) and len(value) == count and all(low <= n <= 255 for n in value)
        )

    if not all(ints(v, 2, 1) for v in sizes) or not ints(pads, 4, 0):
        return False
    if len(x) != 3 or len(out) != 3:
        return False
    kernel, strides, dilations = sizes
    for axis in (0, 1):
        padded = x[1 + axis] + pads[axis] + pads[axis + 2]
        reach = (kernel[axis] - 1) * dilations[axis] + 1
        if reach > padded or (out[1 + axis] - 1) * strides[axis] >= padded:
            return False
    return True


def _validate_code(r: _Reader, code: np.ndarray, outs: np.ndarray, dram_size: int) -> None:
    """Opcodes, layer numbers, each EXEC's output rows and channels inside its layer's output
    ([C, H, W] per layer in `outs`), and every DMA transfer inside the DRAM."""
    if not len(code):
        return
    ops, layer = code[:, 0], code[:, 1]
    _check(r, bool(np.isin(ops, (LOAD, STORE, EXEC)).all()), "unknown opcode")
    _check(r, bool((layer < len(outs)).all()), "instruction refers to an unknown layer")
    execs = code[ops == EXEC].astype(np.int64)
    if len(execs):
        r0, rows, ch0, chs = execs[:, 2], execs[:, 3], execs[:, 4], execs[:, 5]
        out = outs[execs[:, 1]]
        inside = (rows >= 1) & (r0 + rows <= out[:, 1]) & (chs >= 1) & (ch0 + chs <= out[:, 0])
        _check(r, bool(inside.all()), "an EXEC tile leaves its layer's output")
    for kind, dram_col, stride_col in ((LOAD, 2, 6), (STORE, 3, 7)):
        rows = code[ops == kind].astype(np.int64)
        if len(rows):
            block, count = rows[:, 4], rows[:, 5]
            last = rows[:, dram_col] + rows[:, stride_col] * np.maximum(count - 1, 0) + block
            _check(r, bool((last <= dram_size).all()), "a DMA transfer leaves the DRAM")
            _check(r, bool((count <= 1 << 16).all()), "a DMA count is out of range")


def load_tvn(path: str | os.PathLike) -> Module:
    path = Path(path)
    if not path.is_file():
        raise FormatError(f"{path}: no such file")
    return decode(path.read_bytes(), str(path))
