"""The .tvn format: deterministic, lossless, and every corrupt file is a FormatError."""

import hashlib
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onebuild.errors import FormatError, UserError
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.passes import run_preset
from onebuild.graph_ir.quant.calibrate import calibrate
from onebuild.graph_ir.quant.config import QuantConfig
from onebuild.graph_ir.quant.quantize_graph import quantize_graph
from onebuild.graph_ir.serde import load_model
from onebuild.npz import read_npz
from onebuild.targets.trix_sim.codegen import EXEC, generate
from onebuild.targets.trix_sim.hardware import load_hardware
from onebuild.targets.trix_sim.lower import lower
from onebuild.targets.trix_sim.simulator import Simulator
from onebuild.targets.trix_sim.tvn import (
    CODE,
    DIGEST,
    HEADER,
    SECTION,
    decode,
    encode,
    load_tvn,
    save_tvn,
)
from onebuild.targets.trix_sim.tvn_layers import Reader, check_layer

DIGITS = Path(__file__).parent.parent / "examples" / "digits"
HW = load_hardware("trix-s")


def _digits_graph():
    model = load_model(DIGITS / "digits.onnx", {"input": [1, 1, 8, 8]})
    run_preset(model)
    ranges = calibrate(model.main, read_npz(DIGITS / "data" / "calib.npz")).ranges
    return quantize_graph(model.main, ranges, QuantConfig(input_type="uint8", output_type="uint8"))


GRAPH = _digits_graph()
DATA = encode(generate(lower(GRAPH, HW), HW))
SAMPLE = {"input": np.arange(64, dtype=np.uint8).reshape(1, 1, 8, 8) * 3}


def test_round_trip_is_lossless_and_deterministic(tmp_path):
    assert encode(generate(lower(_digits_graph(), HW), HW)) == DATA
    save_tvn(decode(DATA), tmp_path / "m.tvn")
    assert (tmp_path / "m.tvn").read_bytes() == DATA
    got, _ = Simulator(load_tvn(tmp_path / "m.tvn"), HW).run(SAMPLE)
    want = Interpreter(GRAPH).run(SAMPLE)
    np.testing.assert_array_equal(got["logits"], want["logits"])


def _resealed(content: bytes) -> bytes:
    return content + hashlib.sha256(content).digest()


@pytest.mark.parametrize("cut", [0, 3, 20, 100, len(DATA) // 2, len(DATA) - 1])
def test_truncations_are_rejected(cut):
    with pytest.raises(FormatError):
        decode(DATA[:cut])


@pytest.mark.parametrize("position", [0, 5, 40, len(DATA) // 3, len(DATA) - 40])
def test_flipped_bytes_are_rejected(position):
    data = bytearray(DATA)
    data[position] ^= 0x5A
    with pytest.raises(FormatError, match="not a valid .tvn"):
        decode(bytes(data))


def test_absurd_counts_and_offsets_with_a_valid_checksum():
    content = bytearray(DATA[:-DIGEST])
    huge_count = bytearray(content)
    struct.pack_into("<I", huge_count, 8, 1_000_000)  # section count
    offset = bytearray(content)
    kind, _, _, size = SECTION.unpack_from(content, HEADER.size)
    struct.pack_into("<IIQQ", offset, HEADER.size, kind, 0, 1 << 60, size)
    for bad in (huge_count, offset):
        with pytest.raises(FormatError):
            decode(_resealed(bytes(bad)))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_resealed_mutations_never_crash(data):
    """Mutate bytes *and* fix the checksum: decode and simulate fail cleanly or succeed."""
    content = bytearray(DATA[:-DIGEST])
    for _ in range(data.draw(st.integers(1, 4))):
        position = data.draw(st.integers(0, len(content) - 1))
        content[position] = data.draw(st.integers(0, 255))
    try:
        module = decode(_resealed(bytes(content)))
        Simulator(module, HW).run(SAMPLE)
    except UserError:  # FormatError, or a clean "compiled for another preset / input size"
        pass


def _first_exec_rows_offset(content: bytes) -> int:
    """The byte offset of the first EXEC instruction's `rows` field."""
    count = HEADER.unpack_from(content)[3]
    for i in range(count):
        kind, _, offset, size = SECTION.unpack_from(content, HEADER.size + i * SECTION.size)
        if kind == CODE:
            code = np.frombuffer(content[offset : offset + size], "<u4").reshape(-1, 10)
            first = int(np.flatnonzero(code[:, 0] == EXEC)[0])
            return offset + (first * 10 + 3) * 4
    raise AssertionError("no CODE section")


def test_tiles_and_windows_outside_their_layer_are_rejected():
    """Found by the mutation test in CI: one byte made an EXEC tile 1,040,187,400 rows tall and
    the simulator tried to allocate its 38.8 GiB input window."""
    content = bytearray(DATA[:-DIGEST])
    content[_first_exec_rows_offset(content) + 3] = 62  # the rows field's top byte
    with pytest.raises(FormatError, match="an EXEC tile leaves its layer's output"):
        decode(_resealed(bytes(content)))
    module = decode(DATA)
    conv = next(layer for layer in module.layers if layer.kind == "conv")
    conv.attrs["strides"] = [200, 1]
    with pytest.raises(FormatError, match="window attributes do not match its tensors"):
        check_layer(Reader(b"", "x.tvn"), conv, module.tensors)
