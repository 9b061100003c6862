"""Structural mutations of the decoded descriptions of IR files and .tvn files, re-sealed with a
valid checksum: a field replaced by a value of another type, a negative or huge integer, a key
deleted or added, a list emptied. Loading and running must succeed or raise onebuild's
FormatError/UserError with a one-line message; nothing else may escape (the byte-flip tests in
test_tvn.py and test_irfile.py cover the binary layer).
"""

import copy
import hashlib
import json
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onebuild.errors import FormatError, UserError
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.ir import Graph, Model
from onebuild.graph_ir.passes import run_preset
from onebuild.graph_ir.quant.calibrate import calibrate
from onebuild.graph_ir.quant.config import QuantConfig
from onebuild.graph_ir.quant.model_io import with_quantized_io
from onebuild.graph_ir.quant.quantize_graph import quantize_graph
from onebuild.graph_ir.serde import load_model, save_ir
from onebuild.graph_ir.serde.irfile import _FIXED, load_ir
from onebuild.npz import read_npz
from onebuild.targets.binary import run_binary
from onebuild.targets.trix_sim.codegen import generate
from onebuild.targets.trix_sim.hardware import load_hardware
from onebuild.targets.trix_sim.lower import lower
from onebuild.targets.trix_sim.runner import TvnBinary, describe
from onebuild.targets.trix_sim.tvn import (
    DIGEST,
    HEADER,
    LAYERS,
    META,
    SECTION,
    VERSION,
    decode,
    encode,
)

DIGITS = Path(__file__).parent.parent / "examples" / "digits"
CONTROL_FLOW = Path(__file__).parent / "data" / "torch_models" / "value_if.onnx"  # If, branches
HW = load_hardware("trix-s")
EXAMPLES = 300
SMALL = 1 << 22  # run a mutated model only when its inputs are this small (bytes)


def _models():
    model = load_model(DIGITS / "digits.onnx", {"input": [1, 1, 8, 8]})
    run_preset(model)
    ranges = calibrate(model.main, read_npz(DIGITS / "data" / "calib.npz")).ranges
    config = QuantConfig(input_type="uint8", output_type="uint8")
    quantized = quantize_graph(model.main, ranges, config)
    return model, quantized


FLOAT_MODEL, QUANTIZED = _models()


@pytest.fixture(scope="module")
def ir_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ir")
    files = []
    for name, graph in (("float", FLOAT_MODEL.main), ("quantized", QUANTIZED)):
        path = folder / f"{name}.obir"
        save_ir(type(FLOAT_MODEL)([graph], dict(FLOAT_MODEL.metadata)), path)
        files.append(path.read_bytes())
    path = folder / "control_flow.obir"
    save_ir(load_model(CONTROL_FLOW, {"x": [1, 1, 8, 8]}), path)
    files.append(path.read_bytes())
    return files


TVN = encode(generate(lower(with_quantized_io(QUANTIZED), HW), HW))


# -- mutations of decoded JSON -----------------------------------------------------------------
REPLACEMENTS = [None, True, False, 0, -1, 1, 7, -(1 << 31), 1 << 31, 1 << 62, 1 << 64, -(1 << 70),
                0.5, -2.5, 1e308, float("inf"), float("nan"), "", "x", "float32", [], [0], [-1],
                [1 << 40, 1 << 40], ["x"], [None], {}, {"x": 1}]  # fmt: skip


def _paths(node, prefix=()):
    """Every (path, value) of a JSON tree, containers included."""
    yield prefix, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _paths(value, (*prefix, index))


def _parent(tree, path):
    for key in path[:-1]:
        tree = tree[key]
    return tree


@st.composite
def mutated(draw, tree):
    """A deep copy of `tree` with one to three structural mutations."""
    tree = json.loads(json.dumps(tree))
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p, _ in _paths(tree) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent, key = _parent(tree, path), path[-1]
        action = draw(st.sampled_from(["replace", "replace", "delete", "add", "empty", "scale"]))
        value = parent[key]
        if action == "replace":
            parent[key] = copy.deepcopy(draw(st.sampled_from(REPLACEMENTS)))
        elif action == "delete":
            del parent[key]
        elif action == "add" and isinstance(value, dict):
            value[draw(st.sampled_from(["zzz", "name", "quant", "extra"]))] = copy.deepcopy(
                draw(st.sampled_from(REPLACEMENTS))
            )
        elif action == "add" and isinstance(value, list):
            value.append(
                copy.deepcopy(draw(st.sampled_from(REPLACEMENTS)) if not value else value[0])
            )
        elif action == "empty" and isinstance(value, list | dict):
            value.clear()
        elif isinstance(value, int) and not isinstance(value, bool):
            parent[key] = value * draw(st.sampled_from([-1, 0, 2, 1 << 20, 1 << 40]))
    return tree


def _one_line(error: Exception) -> None:
    assert "\n" not in str(error) and str(error), repr(error)


# -- IR files ----------------------------------------------------------------------------------
def _ir_parts(data: bytes):
    _, _, _, text_len, data_offset, data_length = _FIXED.unpack_from(data)
    header = json.loads(data[_FIXED.size : _FIXED.size + text_len])
    return header, data[data_offset : data_offset + data_length]


def _ir_resealed(header, blob: bytes) -> bytes:
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    offset = -(-(_FIXED.size + len(text)) // 64) * 64
    fixed = _FIXED.pack(b"OBIR\x89\r\n\x1a", 1, 0, len(text), offset, len(blob))
    body = fixed + text + b"\0" * (offset - _FIXED.size - len(text)) + blob
    return body + hashlib.sha256(body).digest()


def _load_and_run_ir(path: Path) -> None:
    model = load_ir(path)
    graph = model.main
    if sum(v.size * v.dtype.itemsize for v in graph.inputs) > SMALL:
        return
    feeds = {v.name: np.ones((2, *v.shape), v.dtype) for v in graph.inputs}
    Interpreter(graph).run_batch(feeds)


def test_ir_reseal_helper_round_trips(ir_files, tmp_path):
    for data in ir_files:
        assert _ir_resealed(*_ir_parts(data)) == data


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_ir_structural_mutations_fail_cleanly(ir_files, tmp_path_factory, data):
    source = ir_files[data.draw(st.integers(0, len(ir_files) - 1))]
    header, blob = _ir_parts(source)
    path = tmp_path_factory.mktemp("m") / "m.obir"
    path.write_bytes(_ir_resealed(data.draw(mutated(header)), blob))
    try:
        _load_and_run_ir(path)
    except UserError as error:  # FormatError naming the file, or a clean input complaint
        _one_line(error)
        if isinstance(error, FormatError):
            assert str(path) in str(error)


def test_a_reduction_naming_an_axis_twice_is_refused_at_load(tmp_path):
    """Found by the fuzzing above: axes [0, 1, 2, 3, 0] reached numpy's mean (an internal
    error) instead of being refused with the file's name."""
    graph = Graph("g")
    x = graph.add_input("x", np.dtype(np.float32), (1, 2, 3, 3))
    graph.outputs.append(
        graph.make_node("ReduceMean", [x], {"axes": [0, 1], "keepdims": 0}).outputs[0]
    )
    path = tmp_path / "m.obir"
    save_ir(Model([graph]), path)
    header, blob = _ir_parts(path.read_bytes())
    header["graphs"][0]["nodes"][0]["attrs"]["axes"] = [0, 1, 2, 3, 0]
    path.write_bytes(_ir_resealed(header, blob))
    with pytest.raises(FormatError, match=r"axes \[0, 1, 2, 3, 0\] name an axis twice"):
        _load_and_run_ir(path)


# -- .tvn files --------------------------------------------------------------------------------
def _tvn_sections(data: bytes) -> list[tuple[int, bytes]]:
    count = HEADER.unpack_from(data)[3]
    sections = []
    for i in range(count):
        kind, _, offset, size = SECTION.unpack_from(data, HEADER.size + i * SECTION.size)
        sections.append((kind, data[offset : offset + size]))
    return sections


def _tvn_resealed(sections: list[tuple[int, bytes]]) -> bytes:
    offset = -(-(HEADER.size + SECTION.size * len(sections)) // 16) * 16
    table, body = [], b""
    for kind, blob in sections:
        table.append(SECTION.pack(kind, 0, offset + len(body), len(blob)))
        body += blob + b"\0" * (-len(blob) % 16)
    head = HEADER.pack(b"TVN\0", VERSION, 0, len(sections), 0) + b"".join(table)
    content = head + b"\0" * (offset - len(head)) + body
    return content + hashlib.sha256(content).digest()


def test_tvn_reseal_helper_round_trips():
    assert _tvn_resealed(_tvn_sections(TVN)) == TVN
    assert len(TVN) > DIGEST


def _with_json(sections, kind: int, tree) -> list[tuple[int, bytes]]:
    text = json.dumps(tree, sort_keys=True, separators=(",", ":")).encode()
    return [(k, text if k == kind else blob) for k, blob in sections]


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_tvn_structural_mutations_fail_cleanly(data):
    sections = _tvn_sections(TVN)
    kind = data.draw(st.sampled_from([LAYERS, LAYERS, LAYERS, META]))
    tree = json.loads(dict(sections)[kind])
    blob = _tvn_resealed(_with_json(sections, kind, data.draw(mutated(tree))))
    try:
        module = decode(blob, "m.tvn")
        feeds = {n: np.linspace(-1, 1, 2 * int(np.prod(module.tensors[n].dims)))
                 .reshape(2, *module.tensors[n].dims) for n in module.inputs}  # fmt: skip
        run_binary(TvnBinary(module), feeds, raw=False)
        describe(module)
    except UserError as error:
        _one_line(error)
        if isinstance(error, FormatError):
            assert "m.tvn" in str(error)


IO_FIELDS = struct.Struct("<BBBB4IdiQQH")


@settings(max_examples=EXAMPLES // 2, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_tvn_io_table_field_mutations_fail_cleanly(data):
    """Each field of an IO record replaced by an extreme value of its type."""
    sections = _tvn_sections(TVN)
    io = bytearray(dict(sections)[2])
    count = struct.unpack_from("<I", io)[0]
    entry = data.draw(st.integers(0, count - 1))
    at = 4
    for _ in range(entry):
        at += IO_FIELDS.size + IO_FIELDS.unpack_from(io, at)[-1]
    fields = list(IO_FIELDS.unpack_from(io, at))
    index = data.draw(st.integers(0, len(fields) - 2))  # not the name length
    fields[index] = data.draw(
        st.sampled_from([0, 1, 2, 3, 255]) if index < 4 else st.sampled_from([0, 1, 3, 1 << 31])
        if index < 8 else st.sampled_from([0.0, -1.0, 1e300, float("nan"), float("inf")])
        if index == 8 else st.sampled_from([0, -1, 255, -(1 << 31)])
        if index == 9 else st.sampled_from([0, 1, 1 << 40, (1 << 64) - 1])
    )  # fmt: skip
    IO_FIELDS.pack_into(io, at, *fields)
    blob = _tvn_resealed([(k, bytes(io) if k == 2 else b) for k, b in sections])
    try:
        module = decode(blob, "m.tvn")
        describe(module)
    except UserError as error:
        _one_line(error)
