"""Integer model inputs (indices) on the device path, in quantized builds and in ONE's HDF5
data; integer data for a quantized input without --raw. The model is the trained digits CNN
with an index input that picks three of its logits (Gather), fed the digits test images."""

from pathlib import Path

import h5py
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from onebuild import Session
from onebuild.cli import main
from onebuild.errors import UserError
from onebuild.graph_ir.quant.params import quantize
from onebuild.graph_ir.serde import load_ir
from onebuild.npz import read_npz, write_npz

DIGITS = Path(__file__).parent.parent / "examples" / "digits"
PICK = [3, 1, 7]


def pick_model(path: Path, dtype=TensorProto.INT64) -> Path:
    """digits.onnx (batch 1) with an index input `idx` [3] and an output `picked`: logits[idx]."""
    model = onnx.load(DIGITS / "digits.onnx")
    graph = model.graph
    graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1
    graph.input.append(helper.make_tensor_value_info("idx", dtype, [3]))
    graph.node.append(helper.make_node("Gather", ["logits", "idx"], ["picked"], axis=1))
    graph.output.append(helper.make_tensor_value_info("picked", TensorProto.FLOAT, [1, 3]))
    onnx.save(model, path)
    return path


@pytest.fixture(scope="module")
def images():
    return read_npz(DIGITS / "data" / "test.npz")["input"][:24]  # [N, 1, 1, 8, 8]


def sqnr_db(want: np.ndarray, got: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(want**2) / np.sum((want - got) ** 2)))


def test_integer_inputs_keep_their_type_through_auto_compilation(tmp_path, images, capsys):
    path = pick_model(tmp_path / "pick.onnx")
    reference = ort.InferenceSession(str(path))
    idx = np.array(PICK, np.int64)
    session = Session(path, workspace=tmp_path / "ws")
    session.set_odc_param_minmax_records_count(8)
    want, got = [], []
    for x in images:
        out = session.run_with_auto_compilation({"input": x, "idx": idx})
        ort_picked = reference.run(["picked"], {"input": x, "idx": idx})[0]
        if session.state == "INITIAL":  # the float model: onnxruntime's numbers
            np.testing.assert_allclose(out["picked"], ort_picked, rtol=1e-5, atol=1e-5)
        want.append(ort_picked)
        got.append(out["picked"])
        assert out["picked"].dtype == np.float32
        np.testing.assert_array_equal(out["picked"], out["logits"][:, PICK])
    assert session.state == "COMPILED", session.reason  # the conv stack on the NPU, Gather on CPU
    compiled = sqnr_db(np.stack(want[8:]), np.stack(got[8:]))
    print(f"compiled picked logits vs onnxruntime: {compiled:.1f} dB")
    assert compiled > 20  # 8 recorded runs (24.0 dB measured)
    # an int32 index array is the same index; float indices are refused in one line
    first = session.run({"input": images[0], "idx": idx})["picked"]
    same = session.run({"input": images[0], "idx": idx.astype(np.int32)})
    np.testing.assert_array_equal(same["picked"], first)
    with pytest.raises(UserError, match="input 'idx' has dtype float32, expected int64"):
        session.run({"input": images[0], "idx": idx.astype(np.float32)})
    # the compiled package opened on its own takes the same int64 indices
    package = Session(tmp_path / "ws" / "compiled.nnpkg")
    np.testing.assert_array_equal(package.run({"input": images[0], "idx": idx})["picked"], first)
    # `onebuild run PKG.nnpkg` takes int32 indices as the Session does, int64 ones alike
    for dtype in (np.int64, np.int32):
        data = {"input": images[:2], "idx": np.tile(idx, (2, 1)).astype(dtype)}
        write_npz(tmp_path / f"{dtype.__name__}.npz", data)
        argv = ["run", str(tmp_path / "ws" / "compiled.nnpkg"), "-i"]
        argv += [str(tmp_path / f"{dtype.__name__}.npz"), "-o", str(tmp_path / "o.npz")]
        assert main(argv) == 0
        np.testing.assert_array_equal(read_npz(tmp_path / "o.npz")["picked"][0], first)
    write_npz(tmp_path / "bad.npz", {"input": images[:2], "idx": np.full((2, 3), 17, np.int32)})
    argv[3] = str(tmp_path / "bad.npz")
    capsys.readouterr()
    assert main(argv) == 2
    assert f"{tmp_path / 'bad.npz'}: while executing node 'picked'" in capsys.readouterr().err


@pytest.mark.parametrize("mode", [["--quantize", "uint8"], ["--auto-compile"]])
def test_run_on_device_takes_integer_inputs(tmp_path, images, mode, capsys):
    path = pick_model(tmp_path / "pick.onnx")
    idx = np.tile(np.array(PICK, np.int64), (len(images), 1))
    write_npz(tmp_path / "in.npz", {"input": images, "idx": idx})
    argv = ["run", str(path), "-i", str(tmp_path / "in.npz"), "-o", str(tmp_path / "o.npz")]
    assert main([*argv, *mode, "--minmax-runs", "8"]) == 0
    out = read_npz(tmp_path / "o.npz")
    reference = ort.InferenceSession(str(path))
    want = np.stack([reference.run(["picked"], {"input": x, "idx": PICK})[0] for x in images])
    db = sqnr_db(want, out["picked"])
    print(f"{mode[0]}: picked logits vs onnxruntime {db:.1f} dB")
    assert db > 20  # 8 recorded runs: 25.4 dB measured
    # an index out of range is a one-line error naming the data file, as in the other modes
    write_npz(tmp_path / "bad.npz", {"input": images, "idx": np.where(idx == 7, 17, idx)})
    argv[3] = str(tmp_path / "bad.npz")
    capsys.readouterr()
    assert main([*argv, *mode, "--minmax-runs", "8"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"{tmp_path / 'bad.npz'}: while executing node 'picked' (Gather)" in err


@pytest.mark.parametrize("data", ['calibration = "calib.npz"', "random_calibration = true"])
def test_input_type_applies_to_float_inputs_only(tmp_path, images, data):
    """input_type = "uint8": the image input takes codes, the index input stays int64 (random
    calibration data holds valid indices: zeros)."""
    path = pick_model(tmp_path / "pick.onnx")
    idx = np.tile(np.array(PICK, np.int64), (len(images), 1))
    write_npz(tmp_path / "calib.npz", {"input": images, "idx": idx})
    recipe = tmp_path / "pick.toml"
    recipe.write_text(
        f'[import]\nsource = "{path}"\n[quantize]\n{data}\n'
        'input_type = "uint8"\n[build]\ndir = "build"\n'
    )
    assert main(["build", str(recipe)]) == 0
    graph = load_ir(tmp_path / "build" / "quantize.obir").main
    types = {v.name: (v.dtype.name, v.quant is not None) for v in graph.inputs}
    assert types == {"input": ("uint8", True), "idx": ("int64", False)}


def write_h5(path: Path, samples: list[np.ndarray], raw: bool) -> None:
    """ONE's layout (value/<sample>/<input index>), raw bytes as rawdata2hdf5 writes them."""
    with h5py.File(path, "w") as handle:
        group = handle.create_group("value")
        if raw:
            group.attrs["rawData"] = "1"
        for index, sample in enumerate(samples):
            arrays = group.create_group(str(index))
            for position, array in enumerate(sample):
                data = np.frombuffer(array.tobytes(), np.uint8) if raw else array
                arrays.create_dataset(str(position), data=data)


@pytest.mark.parametrize("raw", [True, False])
def test_hdf5_data_keeps_an_integer_input_type(tmp_path, images, raw):
    """ONE's data for an int32 index input calibrates like the same npz, byte for byte."""
    path = pick_model(tmp_path / "pick.onnx", TensorProto.INT32)
    rng = np.random.default_rng(0)
    idx = rng.integers(0, 10, (len(images), 3)).astype(np.int32)
    write_h5(tmp_path / "calib.h5", [(x, i) for x, i in zip(images, idx)], raw)
    write_npz(tmp_path / "calib.npz", {"input": images, "idx": idx})
    for data in ("calib.h5", "calib.npz"):
        recipe = tmp_path / f"{data}.toml"
        recipe.write_text(
            f'[import]\nsource = "{path}"\n[quantize]\ncalibration = "{data}"\n'
            f'[build]\ndir = "build_{data}"\n'
        )
        assert main(["build", str(recipe)]) == 0
    h5, npz = (tmp_path / f"build_{d}" / "quantize.obir" for d in ("calib.h5", "calib.npz"))
    assert h5.read_bytes() == npz.read_bytes()


def test_integer_data_for_a_quantized_input_is_refused_without_raw(tmp_path, images, capsys):
    """A uint8-input package, binary or IR model fed uint8 data: codes or values? Refused
    (exit 2, one line); --raw feeds codes, float data is quantized, and both give the same
    logits (a binary's --raw logits are codes: the same classes)."""
    recipe = tmp_path / "u8.toml"
    recipe.write_text(
        f'[import]\nsource = "{DIGITS / "digits.onnx"}"\n'
        "input_shapes = { input = [1, 1, 8, 8] }\n"
        f'[quantize]\ncalibration = "{DIGITS / "data" / "calib.npz"}"\ninput_type = "uint8"\n'
        '[codegen]\n[pack]\noutput = "u8.nnpkg"\n[build]\ndir = "build"\n'
    )
    assert main(["build", str(recipe)]) == 0
    graph = load_ir(tmp_path / "build" / "quantize.obir").main
    codes = quantize(images, graph.inputs[0].quant, "uint8")
    write_npz(tmp_path / "codes.npz", {"input": codes})
    write_npz(tmp_path / "values.npz", {"input": images})
    build = tmp_path / "build"
    for model in (tmp_path / "u8.nnpkg", build / "codegen.tvn", build / "quantize.obir"):
        run = ["run", str(model), "-o", str(tmp_path / "o.npz"), "-i"]
        capsys.readouterr()
        assert main([*run, str(tmp_path / "codes.npz")]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "input 'input' is quantized" in err, err
        assert "pass --raw to feed codes, or float values to quantize them" in err
        assert not (tmp_path / "o.npz").exists()
        assert main([*run, str(tmp_path / "codes.npz"), "--raw"]) == 0
        raw = read_npz(tmp_path / "o.npz")["logits"]
        (tmp_path / "o.npz").unlink()
        assert main([*run, str(tmp_path / "values.npz")]) == 0
        values = read_npz(tmp_path / "o.npz")["logits"]
        if raw.dtype.kind == "f":  # float model outputs: the same numbers
            np.testing.assert_array_equal(values, raw)
        else:  # a binary's --raw outputs are codes too: the same classes
            np.testing.assert_array_equal(values.argmax(-1), raw.argmax(-1))
        (tmp_path / "o.npz").unlink()
    # the Session (float values in, always) says so too
    session = Session(tmp_path / "u8.nnpkg", workspace=tmp_path / "ws")
    with pytest.raises(UserError, match="could be codes or values; feed float values"):
        session.run({"input": codes[0]})


def test_an_output_listed_twice_packs_and_runs_as_in_onert(tmp_path, images):
    """digits.onnx with outputs [logits, logits]: the package lists the tensor twice (model
    outputs 0 and 1, as ONE's writer does); onert runs it, and so do onebuild's run, inspect
    and Session, with onnxruntime's numbers."""
    import onert

    model = onnx.load(DIGITS / "digits.onnx")
    model.graph.output.append(model.graph.output[0])
    onnx.save(model, tmp_path / "twice.onnx")
    recipe = tmp_path / "twice.toml"
    recipe.write_text(
        '[import]\nsource = "twice.onnx"\ninput_shapes = { input = [1, 1, 8, 8] }\n'
        '[pack]\noutput = "twice.nnpkg"\n[build]\ndir = "build"\n'
    )
    assert main(["build", str(recipe)]) == 0
    package = tmp_path / "twice.nnpkg"
    assert main(["inspect", str(package)]) == 0
    write_npz(tmp_path / "in.npz", {"input": images})
    assert (
        main(["run", str(package), "-i", str(tmp_path / "in.npz"), "-o", str(tmp_path / "o.npz")])
        == 0
    )
    got = read_npz(tmp_path / "o.npz")["logits"]
    reference = ort.InferenceSession(str(tmp_path / "twice.onnx"))
    want = np.stack([reference.run(None, {"input": x})[0] for x in images])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    session = onert.infer.session(str(package))
    for x, logits in zip(images, got):
        first, second = session.infer([x])
        np.testing.assert_array_equal(first, second)
        np.testing.assert_allclose(first, logits, rtol=1e-5, atol=1e-5)
    session_out = Session(package, workspace=tmp_path / "ws").run({"input": images[0]})
    np.testing.assert_array_equal(session_out["logits"], got[0])


def test_inputs_of_the_wrong_kind_are_one_line_errors(tmp_path, images):
    """Session.run takes a dict by input name; compile.calibrate takes dicts (or labeled
    pairs): a list of arrays is a UserError saying what is expected, never a ValueError."""
    from onebuild.compile import calibrate
    from onebuild.graph_ir.serde import load_model

    session = Session(DIGITS / "digits.onnx", tmp_path / "ws", input_shapes={"input": [1, 1, 8, 8]})
    with pytest.raises(UserError, match=r"inputs are a dict of arrays by input name \(input\)"):
        session.run([images[0]])
    graph = load_model(DIGITS / "digits.onnx", {"input": [1, 1, 8, 8]}).main
    with pytest.raises(UserError, match=r"batch 0 is a ndarray; batches are dicts"):
        calibrate(graph, [images])
    as_dicts = calibrate(graph, [{"input": images[:12]}, {"input": images[12:]}])
    as_pairs = calibrate(graph, [("calib.npz", {"input": images})])
    assert as_dicts.samples == as_pairs.samples == len(images)
    assert as_dicts.ranges == as_pairs.ranges
