"""onecc configuration files translated into recipes (`onebuild convert-cfg`) and ONE's HDF5
calibration data: a cfg in ONE's template layout builds the same package as the recipe a user
would write, and every key is translated or refused with one line naming it."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from onebuild.datasets import iter_batches
from onebuild.graph_ir.serde import load_ir
from onebuild.npz import read_npz, write_npz

DIGITS = Path(__file__).resolve().parent.parent / "examples" / "digits"
SHAPE = (1, 1, 8, 8)

CFG = """\
[Environment]
ONECC_ENV="ONECC"

[backend]
target=trix

[onecc]
one-import-tf=False
one-import-tflite=False
one-import-bcq=False
one-import-onnx=True
one-optimize=True
one-quantize=True
one-partition=False
one-pack=True
one-codegen=True
one-profile=False
one-infer=False

[one-import-onnx]
input_path=digits.onnx
output_path=digits.circle
dynamic_batch_to_single_batch=True

[one-optimize]
input_path=digits.circle
output_path=digits.opt.circle
fuse_batchnorm_with_conv=True

[one-quantize]
input_path=digits.opt.circle
output_path=digits.q.circle
input_data=calib.h5
input_data_format=h5
quantized_dtype=uint8
granularity=channel
{quantize_extra}
[one-codegen]
backend=trix
command=-o digits.tvn digits.q.circle

[one-pack]
input_path=digits.tvn
output_path=digits_pkg
"""


def onebuild(*args, cwd):
    command = [sys.executable, "-m", "onebuild.cli", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd)


def write_h5(path: Path, samples: np.ndarray, raw: bool = True) -> None:
    """ONE's layout: value/<sample>/<input index>; raw bytes as rawdata2hdf5 writes them."""
    with h5py.File(path, "w") as handle:
        group = handle.create_group("value")
        if raw:
            group.attrs["rawData"] = "1"
        for index, sample in enumerate(samples):
            data = np.frombuffer(sample.astype(np.float32).tobytes(), np.uint8) if raw else sample
            group.create_group(str(index)).create_dataset("0", data=data)


@pytest.fixture
def project(tmp_path):
    shutil.copy(DIGITS / "digits.onnx", tmp_path / "digits.onnx")
    calib = read_npz(DIGITS / "data" / "calib.npz")["input"][:96]
    write_h5(tmp_path / "calib.h5", calib)
    write_npz(tmp_path / "calib.npz", {"input": calib})
    return tmp_path


@pytest.mark.parametrize("raw", [True, False])
def test_hdf5_samples_equal_the_npz_ones(project, raw):
    """Raw bytes and typed arrays both read as the samples, in 64-sample batches."""
    calib = read_npz(project / "calib.npz")["input"]
    write_h5(project / "data.hdf5", calib, raw=raw)
    batches = [b["input"] for _, b in iter_batches(project / "data.hdf5", [("input", SHAPE)])]
    assert [len(b) for b in batches] == [64, 32]
    np.testing.assert_array_equal(np.concatenate(batches), calib)


def test_cfg_builds_what_the_handwritten_recipe_builds(project):
    """ONE's defaults are spelled out (percentile 1 / 99, I/O in the quantized type); the
    translated build quantizes exactly as a recipe with the same settings and npz data."""
    (project / "model.cfg").write_text(CFG.format(quantize_extra=""))
    result = onebuild("convert-cfg", "model.cfg", cwd=project)
    assert result.returncode == 0, result.stderr
    assert "one-codegen's command line is not translated" in result.stderr
    text = (project / "model.toml").read_text()
    for line in ('method = "percentile"', "min_percentile = 1.0", 'input_type = "uint8"'):
        assert line in text
    built = onebuild("build", "model.toml", cwd=project)
    assert built.returncode == 0, built.stderr
    assert (project / "digits_pkg" / "digits" / "metadata" / "MANIFEST").is_file()  # as ONE
    mine = text.replace("calib.h5", "calib.npz").replace("digits_pkg", "mine_pkg")
    (project / "mine.toml").write_text(mine + '\n[build]\ndir = "build_mine"\n')
    assert onebuild("build", "mine.toml", cwd=project).returncode == 0
    ours = load_ir(project / "build" / "model" / "quantize.obir").main
    theirs = load_ir(project / "build_mine" / "quantize.obir").main
    assert [n.attrs for n in ours.nodes] == [n.attrs for n in theirs.nodes]
    again = onebuild("convert-cfg", "model.cfg", cwd=project)  # replaces its own recipe
    assert again.returncode == 0 and (project / "model.toml").read_text() == text


@pytest.mark.parametrize(
    "edit, names",
    [
        (("one-import-tf=False", "one-import-tf=True"), "[onecc] one-import-tf"),
        (("one-infer=False", "one-infer=maybe"), "[onecc] one-infer"),
        (("granularity=channel", "granularity=channel\nampq=True"), "[one-quantize] ampq"),
        (("input_data_format=h5", "input_data_format=list"), "input_data_format"),
        (("input_data=calib.h5", "input_data=missing.h5"), "[one-quantize] input_data"),
        (("backend=trix\n", "backend=npu9\n"), "[one-codegen] backend"),
        (("[one-pack]", "[one-packing]"), "no [one-pack]"),
        (("[onecc]", "[onecc\n"), "model.cfg"),
        (("[one-optimize]", "[one-optimizer]"), "one-optimize"),
        (("target=trix", "target=trix\ncommand=x"), "[backend] command"),
        (
            (
                "granularity=channel",
                "granularity=channel\nmode=moving_average\nmoving_avg_batch=inf",
            ),
            "[one-quantize] moving_avg_batch",
        ),
        (
            ("granularity=channel", "granularity=channel\nmin_percentile=5\nmode=moving_average"),
            "[one-quantize] min_percentile",
        ),
        (("input_data=calib.h5", "input_data=ca\x00lib.h5"), "[one-quantize] input_data"),
    ],
)
def test_untranslatable_keys_are_named(project, edit, names):
    (project / "model.cfg").write_text(CFG.format(quantize_extra="").replace(*edit, 1))
    result = onebuild("convert-cfg", "model.cfg", cwd=project)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and names in lines[0], result.stderr
    assert "Traceback" not in result.stderr and not (project / "model.toml").exists()


def test_a_recipe_it_did_not_write_or_that_was_edited_is_kept(project):
    """convert-cfg replaces its own unedited translation only (onecc's booleans: on/off too)."""
    (project / "model.cfg").write_text(CFG.format(quantize_extra="").replace("=True", "=on"))
    assert onebuild("convert-cfg", "model.cfg", cwd=project).returncode == 0
    recipe = project / "model.toml"
    edited = recipe.read_text().replace('dtype = "uint8"', 'dtype = "int16"')
    for text in ("# mine\n", edited):
        recipe.write_text(text)
        result = onebuild("convert-cfg", "model.cfg", cwd=project)
        assert result.returncode == 2 and "choose -o" in result.stderr
        assert recipe.read_text() == text


@pytest.mark.parametrize(
    "damage, names",
    [
        (lambda p: p.write_bytes(b"not hdf5 at all"), "not an HDF5 file"),
        (lambda p: write_h5(p, np.zeros((3, 1, 1, 8, 7), np.float32)), "value/0/0"),
        (lambda p: write_h5(p, np.zeros((3, 1, 8, 8, 1), np.float32), raw=False), "shape"),
        (
            lambda p: h5py.File(p, "w").create_group("value/²").create_dataset("0", data=[1]),
            "samples named 0, 1",
        ),
        (
            lambda p: h5py.File(p, "w").create_dataset("value/0/0", data=h5py.Empty("f")),
            "empty dataset",
        ),
    ],
)
def test_bad_hdf5_data_is_one_line(project, damage, names):
    damage(project / "calib.h5")
    (project / "model.cfg").write_text(CFG.format(quantize_extra=""))
    assert onebuild("convert-cfg", "model.cfg", cwd=project).returncode == 0
    result = onebuild("build", "model.toml", cwd=project)
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert result.returncode in (1, 2) and len(errors) == 1 and names in errors[0], result.stderr


def test_evaluate_result_becomes_the_accuracy_step(project):
    """one-quantize's evaluate_result with test_data compares the quantized model on those
    samples: the accuracy report holds the metrics onecc would have printed."""
    shutil.copy(project / "calib.h5", project / "test.h5")
    extra = "evaluate_result=True\ntest_data=test.h5\nprint_mae=True\nprint_top1_match=True\n"
    (project / "model.cfg").write_text(CFG.format(quantize_extra=extra))
    assert onebuild("convert-cfg", "model.cfg", cwd=project).returncode == 0
    text = (project / "model.toml").read_text()
    assert '[quantize.accuracy]\ndata = "test.h5"' in text and "mae, top1_match" in text
    built = onebuild("build", "model.toml", cwd=project)
    assert built.returncode == 0, built.stderr
    report = json.loads((project / "build" / "model" / "quantize.accuracy.json").read_text())
    assert {"mae", "top1_match"} <= set(report["outputs"]["logits"]), report["outputs"]


@pytest.mark.parametrize(
    "extra, note",
    [
        ("evaluate_result=True\n", "evaluates on random data"),
        ("test_data=calib.h5\nprint_mae=True\n", "no effect without evaluate_result"),
    ],
)
def test_evaluation_keys_that_cannot_act_are_noted(project, extra, note):
    (project / "model.cfg").write_text(CFG.format(quantize_extra=extra))
    result = onebuild("convert-cfg", "model.cfg", cwd=project)
    assert result.returncode == 0 and note in result.stderr, result.stderr
    assert "[quantize.accuracy]" not in (project / "model.toml").read_text()


def test_io_types_per_tensor_and_flags_turned_off(project):
    """onecc's comma-separated input_type (one per model input) is one type when the entries
    agree (int32 / int64 entries: integer inputs' own types) and refused by name when they
    differ; one-optimize flags set False are listed and said on stderr."""
    cfg = CFG.replace("fuse_batchnorm_with_conv=True", "fuse_batchnorm_with_conv=False")
    (project / "model.cfg").write_text(cfg.format(quantize_extra="input_type=uint8, uint8\n"))
    result = onebuild("convert-cfg", "model.cfg", cwd=project)
    assert result.returncode == 0
    text = (project / "model.toml").read_text()
    assert 'input_type = "uint8"' in text
    assert "turned off in the cfg: fuse_batchnorm_with_conv" in text
    assert "one-optimize flags set False (fuse_batchnorm_with_conv) are not honoured" in (
        result.stderr
    )
    (project / "model.toml").unlink()
    # an int64 entry is an index input's own type, left as is; the float entries agree
    (project / "model.cfg").write_text(cfg.format(quantize_extra="input_type=uint8,int64\n"))
    assert onebuild("convert-cfg", "model.cfg", cwd=project).returncode == 0
    assert 'input_type = "uint8"' in (project / "model.toml").read_text()
    (project / "model.toml").unlink()
    (project / "model.cfg").write_text(cfg.format(quantize_extra="input_type=uint8,float32\n"))
    result = onebuild("convert-cfg", "model.cfg", cwd=project)
    assert result.returncode == 2 and "[one-quantize] input_type" in result.stderr


@pytest.mark.parametrize("name", ['we"ird\\x.onnx', "del\x7f.onnx", "back\\slash.onnx"])
def test_paths_with_backslashes_quotes_or_control_characters_read_back(project, name):
    """The recipe is written with every string escaped: the `toml` package left `\\x` and DEL
    unescaped (a recipe `onebuild list` could not parse, or a path that changed)."""
    import tomllib

    shutil.copy(project / "digits.onnx", project / name)
    cfg = CFG.format(quantize_extra="").replace("input_path=digits.onnx", f"input_path={name}")
    (project / "model.cfg").write_text(cfg)
    assert onebuild("convert-cfg", "model.cfg", cwd=project).returncode == 0
    recipe = tomllib.loads((project / "model.toml").read_text())
    assert recipe["import"]["source"] == name
    listed = onebuild("list", "model.toml", cwd=project)
    assert listed.returncode == 0, listed.stderr


def test_convert_cfg_creates_no_folder_and_replaces_no_fifo(project):
    (project / "model.cfg").write_text(CFG.format(quantize_extra=""))
    result = onebuild("convert-cfg", "model.cfg", "-o", "new/r.toml", cwd=project)
    assert result.returncode == 2 and "folder new does not exist" in result.stderr
    assert not (project / "new").exists()
    os.mkfifo(project / "model.toml")
    result = subprocess.run(
        [sys.executable, "-m", "onebuild.cli", "convert-cfg", "model.cfg"],
        capture_output=True, text=True, cwd=project, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2 and "not an unedited convert-cfg translation" in result.stderr
