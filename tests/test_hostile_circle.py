"""Hostile circle/tflite files through the real CLI (tests/hostile_cli.py): every command that
reads a model fails with one line naming the file, exit 2, under an address-space limit."""

import io
from pathlib import Path

import numpy as np
import pytest
from hostile_cli import Case, check_clean_failure

from onebuild.graph_ir.serde import load_onnx, write_circle
from onebuild.graph_ir.serde.flatbuf import Buffer

ROOT = Path(__file__).resolve().parent.parent


def _digits() -> bytes:
    model = load_onnx(ROOT / "examples" / "digits" / "digits.onnx", {"input": [1, 1, 8, 8]})
    return write_circle(model)


DIGITS = _digits()


def _patched(slot_path, value: int, size: int = 4) -> bytes:
    """DIGITS with one field overwritten: `slot_path(root)` gives (table, slot)."""
    data = bytearray(DIGITS)
    table, slot = slot_path(Buffer(DIGITS, "x").root())
    pos = table._field(slot, size)
    data[pos : pos + size] = value.to_bytes(size, "little", signed=value < 0)
    return bytes(data)


def _tensor(i):
    return lambda root: (root.tables(2, "s")[0].tables(0, "t")[i], None)


def _at_root(value: int) -> bytes:
    """DIGITS with the root table's vtable offset overwritten."""
    data = bytearray(DIGITS)
    root = int.from_bytes(DIGITS[:4], "little")
    data[root : root + 4] = value.to_bytes(4, "little", signed=True)
    return bytes(data)


def _npz() -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, input=np.zeros((1, 1, 1, 8, 8), np.float32))
    return buffer.getvalue()


BAD = {
    "empty": b"",
    "header_only": DIGITS[:8],
    "truncated_half": DIGITS[: len(DIGITS) // 2],
    "truncated_tail": DIGITS[:-3],
    "root_offset_past_end": (len(DIGITS) + 100).to_bytes(4, "little") + DIGITS[4:],
    "tensor_type_99": _patched(lambda r: (r.tables(2, "s")[0].tables(0, "t")[0], 1), 99, 1),
    "buffer_index_huge": _patched(lambda r: (r.tables(2, "s")[0].tables(0, "t")[3], 2), 1 << 30),
    "opcode_index_huge": _patched(lambda r: (r.tables(2, "s")[0].tables(3, "o")[1], 0), 999),
    "root_vtable_before_file": _at_root(1 << 30),
    "root_vtable_past_end": _at_root(-(1 << 30)),
}

CASES = [
    Case(f"import-{name}", ["import", "m.circle", "-o", "m.obir"], {"m.circle": data}, "m.circle")
    for name, data in BAD.items()
]
CASES += [
    Case("run-truncated", ["run", "m.circle", "-i", "x.npz", "-o", "y.npz"],
         {"m.circle": BAD["truncated_half"], "x.npz": _npz()}, "m.circle"),
    Case("inspect-type", ["inspect", "m.tflite"],
         {"m.tflite": BAD["tensor_type_99"].replace(b"CIR0", b"TFL3", 1)}, "m.tflite"),
    Case("export-opcode", ["export", "m.circle", "-o", "out.tflite"],
         {"m.circle": BAD["opcode_index_huge"]}, "m.circle"),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_hostile_circle_files(case, tmp_path):
    line = check_clean_failure(case, tmp_path)
    assert "corrupt" in line or "tensor" in line or "operator" in line or "no such" in line


def test_export_of_unsupported_ops_names_every_node(tmp_path):
    source = ROOT / "examples" / "models" / "tiny_mobilenet.onnx"
    case = Case("export-unsupported", ["export", str(source), "-o", "t.circle"], {}, "HardSigmoid")
    line = check_clean_failure(case, tmp_path)
    assert "Erf" in line and "HardSigmoid" in line and not (tmp_path / "t.circle").exists()
