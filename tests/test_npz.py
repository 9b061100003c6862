"""npz reading in-process: limits checked before data is read, no unpickling, finite checks,
calibration statistics that must be finite (the CLI corpus is tests/test_hostile_files.py)."""

import builtins
import io
import pickle
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest

from onebuild.datasets import iter_batches
from onebuild.errors import FormatError, UserError
from onebuild.graph_ir.passes import run_preset
from onebuild.graph_ir.quant.calibrate import CalibrationStats, calibrate
from onebuild.graph_ir.serde import load_model
from onebuild.graph_ir.serde.calibration_file import load_calibration, save_calibration
from onebuild.npz import check_finite, npz_bytes, read_npz, write_npz

DIGITS = Path(__file__).parent.parent / "examples" / "digits"


def test_round_trip_keeps_values_and_names_the_source(tmp_path):
    arrays = {"a": np.arange(6, dtype=np.int16).reshape(2, 3), "b": np.ones((2, 1), np.float32)}
    write_npz(tmp_path / "x.npz", arrays)
    loaded = read_npz(tmp_path / "x.npz")
    assert loaded.source == str(tmp_path / "x.npz")
    for name, array in arrays.items():
        np.testing.assert_array_equal(loaded[name], array)
        assert loaded[name].dtype == array.dtype and loaded[name].flags.writeable


def test_the_size_limit_is_checked_before_any_data_is_read(tmp_path, monkeypatch):
    write_npz(tmp_path / "x.npz", {"a": np.zeros((4, 1000), np.float32)})
    monkeypatch.setenv("ONEBUILD_MAX_NPZ_BYTES", "15000")
    reads = []
    monkeypatch.setattr(zipfile.ZipExtFile, "read", _counting(zipfile.ZipExtFile.read, reads))
    with pytest.raises(FormatError, match="expand to more than"):
        read_npz(tmp_path / "x.npz")
    assert sum(reads) < 1000  # the .npy header only
    monkeypatch.setenv("ONEBUILD_MAX_NPZ_BYTES", "16000")
    assert read_npz(tmp_path / "x.npz")["a"].shape == (4, 1000)


def _counting(read, sizes):
    def counted(self, n=-1):
        data = read(self, n)
        sizes.append(len(data))
        return data

    return counted


def test_object_arrays_are_rejected_without_unpickling(tmp_path, monkeypatch):
    buffer = io.BytesIO()
    # the fixture holds a pickle; the test asserts onebuild never unpickles it
    np.lib.format.write_array(buffer, np.array([{"a": 1}], object), allow_pickle=True)
    with zipfile.ZipFile(tmp_path / "x.npz", "w") as archive:
        archive.writestr("input.npy", buffer.getvalue())

    def forbidden(*args, **kwargs):
        raise AssertionError("unpickling attempted")

    monkeypatch.setattr(pickle, "loads", forbidden)
    monkeypatch.setattr(pickle, "load", forbidden)
    monkeypatch.setattr(builtins, "eval", forbidden)
    with pytest.raises(FormatError, match="never unpickles"):
        read_npz(tmp_path / "x.npz")


def test_check_finite_names_input_and_sample():
    x = np.zeros((5, 3), np.float32)
    x[3, 1] = -np.inf
    with pytest.raises(UserError, match=r"^in\.npz: input 'x' sample 3 contains NaN or Inf"):
        check_finite({"x": x, "ids": np.arange(5)}, "in.npz")
    check_finite({"x": np.zeros((5, 3))}, "in.npz")


def test_folder_samples_are_checked_file_by_file(tmp_path):
    (tmp_path / "data").mkdir()
    x = np.zeros((2, 1, 1, 8, 8), np.float32)
    write_npz(tmp_path / "data" / "a.npz", {"input": x})
    x[1, 0, 0, 0, 0] = np.nan
    write_npz(tmp_path / "data" / "b.npz", {"input": x})
    (tmp_path / "data" / "c.npy").write_bytes(npz_bytes({"input": x}))  # a zip named .npy
    batches = iter_batches(tmp_path / "data", [("input", (1, 1, 8, 8))])
    assert next(batches)[0].endswith("a.npz")
    with pytest.raises(UserError, match=r"b\.npz: input 'input' sample 1 contains NaN"):
        next(batches)


def _digits_graph():
    model = load_model(DIGITS / "digits.onnx", {"input": [1, 1, 8, 8]})
    run_preset(model)
    return model.main


@pytest.mark.parametrize("method", ["minmax", "percentile", "mse", "moving_average"])
def test_calibration_names_the_sample_that_overflows(method):
    """3e38 is a finite float32, but a Conv over it is not: the ranges would be infinite (and
    the percentile histogram used to double its range forever)."""
    x = read_npz(DIGITS / "data" / "calib.npz")["input"][:40].copy()
    x[37, 0, 0, 2, 2] = 3e38
    result = {}

    def run():
        try:
            calibrate(_digits_graph(), [("big.npz", {"input": x})], method)
        except UserError as error:
            result["error"] = str(error)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "calibration did not finish"
    assert result["error"].startswith("big.npz: input 'input' sample 37 ")
    assert "calibration ranges must be finite" in result["error"]


def test_calibration_files_with_non_finite_ranges_are_rejected(tmp_path):
    stats = CalibrationStats("minmax", 3, {"a": (0.0, 1.0), "b": (-1.0, float("inf"))})
    save_calibration(stats, tmp_path / "c.npz")
    with pytest.raises(FormatError, match=r"c\.npz: invalid calibration file: range of 'b'"):
        load_calibration(tmp_path / "c.npz")
    arrays = dict(read_npz(tmp_path / "c.npz", batch=False))
    arrays["ranges"] = arrays["ranges"].astype(str)
    write_npz(tmp_path / "d.npz", arrays)
    with pytest.raises(FormatError, match="'ranges' is not float"):
        load_calibration(tmp_path / "d.npz")


def test_samples_stacked_on_the_batch_axis_of_a_batch_1_input(tmp_path):
    """[N, 1, 8, 8] for an input [1, 1, 8, 8] (onnxruntime's layout) is N samples, as
    [N, 1, 1, 8, 8] is; one sample [1, 1, 8, 8] stays one."""
    x = np.arange(4 * 64, dtype=np.float32).reshape(4, 1, 8, 8)
    write_npz(tmp_path / "stacked.npz", {"input": x})
    write_npz(tmp_path / "one.npz", {"input": x[:1]})
    ((_, stacked),) = iter_batches(tmp_path / "stacked.npz", [("input", (1, 1, 8, 8))])
    np.testing.assert_array_equal(stacked["input"], x[:, None])
    ((_, one),) = iter_batches(tmp_path / "one.npz", [("input", (1, 1, 8, 8))])
    assert one["input"].shape == (1, 1, 1, 8, 8)
    ((_, other),) = iter_batches(tmp_path / "stacked.npz", [("input", (2, 1, 8, 8))])
    assert other["input"].shape == (4, 1, 8, 8)  # batch 2: left for the shape check to refuse
