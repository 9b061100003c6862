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
from ...fields import Fields
from ...fileio import atomic_write_bytes
from .lower import Layer, TensorDesc, chw
from .opcodes import EXEC, LOAD, MAGIC, STORE, Module, align
from .tvn_layers import (
    REQUIRED,
    Reader,
    check,
    check_attrs,
    check_epilogue,
    check_layer,
    code_range,
    per_channel_codes,
    sequence_layer,
)

# 2: data-movement kinds, computed per-channel elementwise operands; 3: convolution epilogues;
# 4: max pool epilogues (EXEC tiles of the pool's output); 5: values quantized per channel
# (convolution zero points and clamps per channel, lookup tables per channel); 6: Gemm over
# the rows of a sequence ([M, K] @ [K, N], tiles of rows x output channels)
VERSION = 6
READABLE = (1, 2, 3, 4, 5, 6)  # an older file is a newer one without what came later
HEADER = struct.Struct("<4sHHII")  # magic, version, flags, section count, reserved
SECTION = struct.Struct("<IIQQ")  # kind, reserved, offset, size
IO_ENTRY = struct.Struct(
    "<BBBB4IdiQQH"
)  # dir, dtype, layout, rank, dims, scale, zp, dram, size, name
RECORD = 40  # 10 x uint32 per instruction
META, IO, LAYERS, CODE, BLOB = 1, 2, 3, 4, 5
KINDS = {META: "META", IO: "IO", LAYERS: "LAYERS", CODE: "CODE", BLOB: "BLOB"}
DTYPES = ["uint8", "int8", "int16", "int32", "int64", "float64"]
LAYER_KINDS = frozenset(REQUIRED)
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
def _sections(r: Reader) -> dict[int, bytes]:
    data = r.data
    if len(data) < HEADER.size + DIGEST or data[:4] != MAGIC:
        raise r.fail("bad magic or too short")
    content, digest = memoryview(data)[:-DIGEST], data[-DIGEST:]  # no copy of the content
    if hashlib.sha256(content).digest() != digest:
        raise r.fail("checksum mismatch (corrupt or truncated)")
    _, version, _, count, _ = HEADER.unpack_from(content)
    if version not in READABLE:
        raise r.fail(f"version {version} is not supported (this onebuild reads 1 to {VERSION})")
    if count > len(KINDS) or HEADER.size + count * SECTION.size > len(content):
        raise r.fail(f"section count {count} is out of range")
    sections = {}
    for i in range(count):
        kind, _, offset, size = SECTION.unpack_from(content, HEADER.size + i * SECTION.size)
        if kind not in KINDS or kind in sections:
            raise r.fail(f"unknown or repeated section kind {kind}")
        if offset + size > len(content) or offset < HEADER.size:
            raise r.fail(f"section {KINDS[kind]} [{offset}, {offset + size}) is out of bounds")
        sections[kind] = bytes(content[offset : offset + size])
    missing = set(KINDS) - set(sections)
    if missing:
        raise r.fail(f"missing section(s) {', '.join(KINDS[k] for k in sorted(missing))}")
    return sections


def _json(r: Reader, data: bytes, what: str):
    try:
        return json.loads(data.decode())
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise r.fail(f"{what} is not valid JSON ({error})") from None


def _io(r: Reader, data: bytes) -> list[tuple]:
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


MAX_DRAM_OFFSET = 1 << 40
BODY_KEYS = {"tensors", "layers", "inputs", "outputs", "arena_bytes", "sram_peak"}
TENSOR_KEYS = {"dims", "dtype", "scale", "zero_point", "dram"}
LAYER_KEYS = {"kind", "name", "inputs", "output", "attrs", "arrays"}


def _tensor(f: Fields, name: str, spec) -> tuple[TensorDesc, int]:
    path = f"tensors['{name}']"
    f.obj(spec, path, TENSOR_KEYS)
    dtype = f.choice(spec["dtype"], f"{path}.dtype", DTYPES[:3])
    dims = f.integers(spec["dims"], f"{path}.dims", 1, 1 << 20, min_len=1, max_len=4)
    scale = f.number(spec["scale"], f"{path}.scale", positive=True)
    zero_point = f.integer(spec["zero_point"], f"{path}.zero_point", *code_range(dtype))
    dram = f.integer(spec["dram"], f"{path}.dram", 0, MAX_DRAM_OFFSET)
    return TensorDesc(name, chw(tuple(dims)), tuple(dims), dtype, scale, zero_point), dram


def decode(data: bytes, where: str = "<bytes>") -> Module:
    """A validated module; every offset and size is checked against the file and the DRAM."""
    r = Reader(bytes(data), where)
    f = Fields(r.fail)
    sections = _sections(r)
    meta = f.obj(_json(r, sections[META], "META"), "META")
    f.text(meta.get("hardware"), "META.hardware")
    body = f.obj(_json(r, sections[LAYERS], "LAYERS"), "LAYERS", BODY_KEYS)
    blob = sections[BLOB]
    code_bytes = sections[CODE]
    check(r, len(code_bytes) % RECORD == 0, "CODE size is not a whole number of records")
    code = np.frombuffer(code_bytes, dtype="<u4").reshape(-1, 10).astype(np.uint32)
    tensors, dram = {}, {}
    for name, spec in f.obj(body["tensors"], "tensors").items():
        tensors[name], dram[name] = _tensor(f, name, spec)
    arena = f.integer(body["arena_bytes"], "arena_bytes", 0, MAX_ARENA)
    dram_size = align(len(blob)) + arena
    for name, t in tensors.items():
        check(r, dram[name] + t.nbytes <= dram_size, f"tensor '{name}' lies outside the DRAM")
    layers, arrays = [], {}
    for index, raw in enumerate(f.array(body["layers"], "layers", min_len=1)):
        layers.append(_layer(r, f, index, raw, tensors, blob, arrays))
    f.unique([layer.name for layer in layers], "layers")
    version = HEADER.unpack_from(r.data)[1]
    for layer in layers:
        per_channel = version < 5 and per_channel_codes(layer)
        check(r, not per_channel, f"layer '{layer.name}' has per-channel codes before version 5")
        sequence = version < 6 and sequence_layer(layer, tensors)
        check(r, not sequence, f"layer '{layer.name}' has sequence parameters before version 6")
    for index, layer in enumerate(layers):
        if "epilogue" in layer.attrs:
            check_epilogue(r, f, index, layers, tensors)
    inputs = _names(f, body["inputs"], "inputs", tensors, 0)
    outputs = _names(f, body["outputs"], "outputs", tensors, 1)
    produced = {layer.output for layer in layers}
    for name in outputs:
        check(r, name in produced or name in inputs, f"no layer produces output '{name}'")
    _check_io_table(r, _io(r, sections[IO]), [*inputs, *outputs], len(inputs), tensors, dram)
    sram_peak = f.integer(body["sram_peak"], "sram_peak", 0, MAX_ARENA)
    outs = np.array([_tile_space(layers, layer, tensors) for layer in layers], np.int64)
    outs = outs.reshape(-1, 3)
    _validate_code(r, code, outs, dram_size)
    module = Module(
        meta, tensors, dram, layers, arrays, blob, code, inputs, outputs, arena, sram_peak
    )
    module.source = where  # named by errors found while simulating (runner.py)
    return module


def _tile_space(layers: list[Layer], layer: Layer, tensors) -> tuple[int, int, int]:
    """(channels, rows, width) that a layer's EXEC tiles name: its output's; a convolution
    with a max pool epilogue computes the pool's tiles; a gemm's are the output channels of
    its weights and its rows (of [M, N]: N, M, 1)."""
    after = layers[layer.attrs["epilogue"]] if "epilogue" in layer.attrs else None
    if after is not None and after.kind == "maxpool":
        return tensors[after.output].shape
    dims = tensors[layer.output].dims
    if layer.kind == "gemm":  # its channels (of its weights), rows
        return layer.arrays["weights"].shape[0], int(np.prod(dims[:-1])), 1
    return tensors[layer.output].shape


def _names(f: Fields, value, path: str, tensors: dict, minimum: int) -> list[str]:
    names = f.array(value, path, min_len=minimum)
    for i, name in enumerate(names):
        f.choice(f.text(name, f"{path}[{i}]"), f"{path}[{i}]", tensors)
    f.unique(names, path)
    return names


def _check_io_table(r: Reader, io: list[tuple], names: list[str], n_in: int, tensors, dram):
    """The binary I/O table (what a runtime reads) says exactly what LAYERS says."""
    check(r, [e[-1] for e in io] == names, "I/O table does not match LAYERS")
    for position, (direction, dtype, layout, rank, *rest) in enumerate(io):
        dims, (scale, zero_point, offset, nbytes, name) = rest[:4], rest[4:]
        t = tensors[name]
        expected = (
            int(position >= n_in), DTYPES.index(t.dtype), 0, len(t.dims),
            [*t.dims, *[1] * (4 - len(t.dims))], t.scale, t.zero_point, dram[name], t.nbytes,
        )  # fmt: skip
        got = (direction, dtype, layout, rank, dims, scale, zero_point, offset, nbytes)
        check(r, got == expected, f"I/O table entry '{name}' does not match its tensor")


def _layer(r: Reader, f: Fields, index: int, raw, tensors, blob: bytes, arrays: dict) -> Layer:
    path = f"layers[{index}]"
    f.obj(raw, path, LAYER_KEYS)
    kind = f.choice(raw["kind"], f"{path}.kind", sorted(LAYER_KINDS))
    name = f.text(raw["name"], f"{path}.name")
    ins = f.array(raw["inputs"], f"{path}.inputs", min_len=1, max_len=1024)
    for i, tensor in enumerate(ins):
        f.choice(f.text(tensor, f"{path}.inputs[{i}]"), f"{path}.inputs[{i}]", tensors)
    out = f.choice(f.text(raw["output"], f"{path}.output"), f"{path}.output", tensors)
    attrs = f.obj(raw["attrs"], f"{path}.attrs")
    check_attrs(f, kind, attrs, [tensors[i] for i in ins], tensors[out], f"{path}.attrs")
    loaded = {}
    for key, spec in f.obj(raw["arrays"], f"{path}.arrays").items():
        where = f"{path}.arrays.{key}"
        f.array(spec, where, 3, 3)
        offset = f.integer(spec[0], f"{where}[0]", 0, len(blob))
        dtype = f.choice(spec[1], f"{where}[1]", DTYPES)
        shape = f.integers(spec[2], f"{where}[2]", 0, 1 << 28, max_len=4)
        count = int(np.prod(shape, dtype=object)) if shape else 1
        nbytes = count * np.dtype(dtype).itemsize
        f.require(offset + nbytes <= len(blob), where, "lies outside the BLOB")
        array = np.frombuffer(blob, dtype=dtype, count=count, offset=offset)
        loaded[key] = array.reshape(shape) if shape else array.reshape(())
        arrays[(index, key)] = offset
    layer = Layer(kind, name, ins, out, attrs, loaded)
    check_layer(r, layer, tensors)
    return layer


def _validate_code(r: Reader, code: np.ndarray, outs: np.ndarray, dram_size: int) -> None:
    """Opcodes, layer numbers, each EXEC's output rows and channels inside its layer's output
    ([C, H, W] per layer in `outs`), and every DMA transfer inside the DRAM."""
    if not len(code):
        return
    ops, layer = code[:, 0], code[:, 1]
    check(r, bool(np.isin(ops, (LOAD, STORE, EXEC)).all()), "unknown opcode")
    check(r, bool((layer < len(outs)).all()), "instruction refers to an unknown layer")
    execs = code[ops == EXEC].astype(np.int64)
    if len(execs):
        r0, rows, ch0, chs = execs[:, 2], execs[:, 3], execs[:, 4], execs[:, 5]
        out = outs[execs[:, 1]]
        inside = (rows >= 1) & (r0 + rows <= out[:, 1]) & (chs >= 1) & (ch0 + chs <= out[:, 0])
        check(r, bool(inside.all()), "an EXEC tile leaves its layer's output")
    for kind, dram_col, stride_col in ((LOAD, 2, 6), (STORE, 3, 7)):
        rows = code[ops == kind].astype(np.int64)
        if len(rows):
            block, count = rows[:, 4], rows[:, 5]
            last = rows[:, dram_col] + rows[:, stride_col] * np.maximum(count - 1, 0) + block
            check(r, bool((last <= dram_size).all()), "a DMA transfer leaves the DRAM")
            check(r, bool((count <= 1 << 16).all()), "a DMA count is out of range")


MAX_FILE = 1 << 30  # BLOB and arena share a DRAM of at most a few hundred MiB in practice


def load_tvn(path: str | os.PathLike) -> Module:
    """Decode the file at `path` (its size is checked before it is read)."""
    path = Path(path)
    if not path.is_file():
        raise FormatError(f"{path}: no such file")
    size = path.stat().st_size
    if size > MAX_FILE:
        raise FormatError(
            f"{path}: not a valid .tvn file: {size} bytes (a TRIX program is at most "
            f"{MAX_FILE >> 20} MiB)"
        )
    return decode(path.read_bytes(), str(path))
