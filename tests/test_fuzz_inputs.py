"""Corrupt inputs are rejected with onebuild's errors, never a crash or another exception."""

from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from onebuild.errors import FormatError, OneBuildError, UserError
from onebuild.graph_ir.serde import load_ir, load_model, save_ir

DIGITS = Path(__file__).parent.parent / "examples" / "digits" / "digits.onnx"
ONNX_BYTES = DIGITS.read_bytes()


@pytest.fixture(scope="module")
def ir_bytes(tmp_path_factory):
    path = tmp_path_factory.mktemp("ir") / "d.obir"
    save_ir(load_model(DIGITS, {"input": [1, 1, 8, 8]}), path)
    return path.read_bytes()


def _mutate(data: bytes, flips: list[tuple[int, int]], cut: int | None) -> bytes:
    mutable = bytearray(data)
    for position, value in flips:
        mutable[position % len(mutable)] ^= value or 1
    return bytes(mutable[:cut] if cut is not None else mutable)


mutations = st.tuples(
    st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), min_size=0, max_size=4),
    st.one_of(st.none(), st.integers(0, len(ONNX_BYTES))),
)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(mutation=mutations)
def test_corrupt_ir_files_are_rejected(ir_bytes, tmp_path, mutation):
    flips, cut = mutation
    data = _mutate(ir_bytes, flips, cut)
    path = tmp_path / "x.obir"
    path.write_bytes(data)
    if data == ir_bytes:
        load_ir(path)
        return
    with pytest.raises(FormatError):
        load_ir(path)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(mutation=mutations)
@example(mutation=([(178, 59)], None))  # a name turned into "p\n": messages must stay one line
def test_corrupt_onnx_files_load_or_fail_cleanly(tmp_path, mutation):
    flips, cut = mutation
    path = tmp_path / "x.onnx"
    path.write_bytes(_mutate(ONNX_BYTES, flips, cut))
    try:
        load_model(path, {"input": [1, 1, 8, 8]})
    except OneBuildError as error:
        assert isinstance(error, UserError) and "\n" not in str(error)
