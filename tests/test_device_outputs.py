"""What a new user found on the device path: output paths that replaced the user's own files or
created folders, a target typo that undid a compiled session, extra inputs ignored, and
errors that did not say which setting was wrong. onebuild replaces only files it wrote and
creates no folders (`onebuild/runtime/outputs.py`); a bad target or preset changes nothing."""

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest

from onebuild import Session
from onebuild.cli import main
from onebuild.errors import UserError
from onebuild.npz import read_npz, write_npz

DIGITS = Path(__file__).parent.parent / "examples" / "digits"
SHAPES = {"input": [1, 1, 8, 8]}
RECORDS = 4


@pytest.fixture(scope="module")
def images():
    return read_npz(DIGITS / "data" / "calib.npz")["input"][:8]


def recorded(workspace: Path, images) -> Session:
    session = Session(DIGITS / "digits.onnx", workspace=workspace, input_shapes=SHAPES)
    session.set_execute_config("DUMP_MINMAX")
    for x in images[:RECORDS]:
        session.run({"input": x})
    session.reset_execute_config()
    return session


def test_session_paths_replace_only_onebuilds_files_and_create_no_folders(tmp_path, images):
    session = recorded(tmp_path / "ws", images)
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    with pytest.raises(UserError, match="notes.txt: exists and is not a compiled binary"):
        session.set_codegen_model_path(notes)
    with pytest.raises(UserError, match="notes.txt: exists and is not an IR file"):
        session.set_quantized_model_path(notes)
    missing = tmp_path / "missing" / "dir"
    with pytest.raises(UserError, match=f"folder {missing} does not exist"):
        session.set_quantized_model_path(missing / "q.obir")
    with pytest.raises(UserError, match="is a folder; set_codegen_model_path takes a file"):
        session.set_codegen_model_path(tmp_path)
    assert notes.read_text() == "my notes\n" and not missing.parent.exists()
    # its own files it replaces: quantize and compile twice to the same paths
    session.set_quantized_model_path(tmp_path / "q.obir")
    session.set_codegen_model_path(tmp_path / "m.tvn")
    session.quantize()
    session.codegen()
    first = (tmp_path / "m.tvn").read_bytes()
    again = recorded(tmp_path / "ws", images)
    again.set_quantized_model_path(tmp_path / "q.obir")
    again.set_codegen_model_path(tmp_path / "m.tvn")
    again.quantize()
    again.codegen()
    assert again.state == "COMPILED" and (tmp_path / "m.tvn").read_bytes() == first
    # a file put there after the path was set is still not replaced
    third = recorded(tmp_path / "ws3", images)
    third.set_quantized_model_path(tmp_path / "later.obir")
    (tmp_path / "later.obir").write_text("arrived later\n")
    with pytest.raises(UserError, match="later.obir: exists and is not an IR file"):
        third.quantize()
    assert (tmp_path / "later.obir").read_text() == "arrived later\n"
    assert third.state == "INITIAL"


def test_the_session_does_not_replace_its_own_model(tmp_path, images):
    source = tmp_path / "digits.obir"
    assert main(["import", str(DIGITS / "digits.onnx"), "--input-shape", "input=1,1,8,8",
                 "-o", str(source)]) == 0  # fmt: skip
    session = Session(source, workspace=tmp_path / "ws")
    with pytest.raises(UserError, match="names its own input"):
        session.set_quantized_model_path(source)


def test_a_circle_that_falls_back_to_ir_never_replaces_the_sessions_model(tmp_path):
    """Per-channel layers cannot be circle, so a quantized model path `m.circle` becomes an IR
    file beside it, `m.circle.obir`: not `m.obir`, which is the model the session opened."""
    from test_channel_activations import _digits, spread_model

    onnx.save(spread_model(), tmp_path / "m.onnx")
    source = tmp_path / "m.obir"
    assert main(["import", str(tmp_path / "m.onnx"), "-o", str(source)]) == 0
    before = source.read_bytes()
    session = Session(source, workspace=tmp_path / "ws")
    session.set_activation_granularity("channel")
    session.set_quantized_model_path(tmp_path / "m.circle")
    session.set_execute_config("DUMP_MINMAX")
    for x in _digits()[0][:16]:
        session.run({"x": x})
    session.reset_execute_config()
    assert session.quantize() == tmp_path / "m.circle.obir"
    assert source.read_bytes() == before and session.state == "QUANTIZED"


def test_a_path_inside_the_workspace_does_not_make_it_foreign(tmp_path, images):
    """A quantized model written into the workspace folder at a path the app chose leaves the
    workspace its own: it reopens (it was refused as holding a foreign file)."""
    session = recorded(tmp_path / "ws", images)
    session.set_quantized_model_path(tmp_path / "ws" / "digits_q.circle")
    session.quantize()
    again = Session(DIGITS / "digits.onnx", workspace=tmp_path / "ws", input_shapes=SHAPES)
    assert again.minmax_records == RECORDS


def onnx_by_someone_else(path: Path) -> None:
    model = onnx.load(DIGITS / "digits.onnx")
    model.producer_name = "pytorch"
    onnx.save(model, path)


def test_cli_outputs_refuse_the_users_files_and_missing_folders(tmp_path, images, capsys):
    inputs = tmp_path / "x.npz"
    write_npz(inputs, {"input": images})
    model = str(DIGITS / "digits.onnx")
    common = [model, "--input-shape", "input=1,1,8,8", "-i", str(inputs)]
    notes, theirs, mine = tmp_path / "notes.txt", tmp_path / "theirs.npz", tmp_path / "m.onnx"
    notes.write_text("my notes\n")
    np.savez(theirs, labels=np.arange(3))
    onnx_by_someone_else(mine)
    before = {p: p.read_bytes() for p in (notes, theirs, mine)}
    device = ["-o", str(tmp_path / "y.npz"), "--workspace", str(tmp_path / "ws"),
              "--quantize", "uint8", "--minmax-runs", "4"]  # fmt: skip
    refused = [
        (["run", *common, *device, "--codegen", "trix_sim", "--cpath", str(notes)], "notes.txt"),
        (["run", *common, *device, "--qpath", str(notes)], "notes.txt"),
        (["run", *common, *device, "--qpath", str(tmp_path / "new" / "q.obir")], "new"),
        (["run", *common, *device, "--codegen", "trix_sim", "--cpath", str(tmp_path)], "folder"),
        (["run", *common, "-o", str(theirs)], "theirs.npz"),
        (["run", *common, "-o", str(tmp_path / "new" / "y.npz")], "new does not exist"),
        (["export", model, "-o", str(mine)], "m.onnx: exists and is not an ONNX model"),
        (["export", model, "-o", str(tmp_path / "new" / "m.circle")], "new does not exist"),
        (["import", model, "-o", str(tmp_path / "notes.obir")], None),
        (["run", *common, *device, "--codegen", "npu"], "target 'npu' is not an installed"),
        (["run", *common, *device, "--auto-compile", "--hw", "trix-x"], "hardware preset 'trix-x'"),
    ]
    (tmp_path / "notes.obir").write_text("not a model\n")
    for argv, message in refused:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("onebuild: error: "), err
        assert message is None or message in err[0], (argv, err)
    assert all(p.read_bytes() == data for p, data in before.items())
    assert not (tmp_path / "new").exists() and not (tmp_path / "ws").exists()
    # what onebuild wrote itself, it replaces
    for argv in (["run", *common, "-o", str(tmp_path / "y.npz")],
                 ["export", model, "-o", str(tmp_path / "e.onnx")],
                 ["export", model, "-o", str(tmp_path / "e.tflite")]):  # fmt: skip
        assert main(argv) == 0 and main(argv) == 0, argv
    capsys.readouterr()


def test_a_target_typo_leaves_a_compiled_session_as_it_was(tmp_path, images):
    session = Session(DIGITS / "digits.onnx", workspace=tmp_path / "ws", input_shapes=SHAPES)
    session.set_odc_param_minmax_records_count(RECORDS)
    for x in images[:RECORDS]:
        session.run_with_auto_compilation({"input": x})
    assert session.state == "COMPILED"
    state = (tmp_path / "ws" / "state.json").read_bytes()
    settings = session.settings
    with pytest.raises(UserError, match=r"target 'npu' is not an installed target \(installed: "):
        session.run_with_auto_compilation({"input": images[5]}, target="npu")
    with pytest.raises(UserError, match="target 'trix' is not an installed target"):
        session.codegen("trix")
    with pytest.raises(UserError, match="no installed target has hardware preset 'trix-x'.*trix-m"):
        session.set_hardware("trix-x")
    assert session.state == "COMPILED" and session.reason is None
    assert session.settings == settings
    assert (tmp_path / "ws" / "state.json").read_bytes() == state
    assert json.loads(state)["state"] == "COMPILED"
    session.run_with_auto_compilation({"input": images[5]})
    assert session.state == "COMPILED"


def test_session_quirks_are_one_line_errors_naming_the_setting(tmp_path, images):
    session = recorded(tmp_path / "ws", images)
    with pytest.raises(UserError, match=r"no model input named 'extra' \(the model's inputs: in"):
        session.run({"input": images[0], "extra": images[0]})
    with pytest.raises(UserError, match="min_sqnr_db='high' is not a threshold: give a finite"):
        session.set_accuracy_gate(min_sqnr_db="high")
    with pytest.raises(UserError, match="max_mae=nan is not a threshold"):
        session.set_accuracy_gate(max_mae=float("nan"))
    assert session.settings.gate == (("min_sqnr_db", 20.0),)
    session.set_accuracy_gate(min_sqnr_db=25)
    assert session.settings.gate == (("min_sqnr_db", 25.0),)


def test_a_folder_of_the_users_is_not_a_workspace(tmp_path, images):
    """The session sweeps hidden temporaries and clears a workspace whose model changed: in a
    folder of the user's that would delete their files, so such a folder is refused whole."""
    home = tmp_path / "home"
    (home / "partition").mkdir(parents=True)
    mine = {".bashrc": "alias ll='ls -l'\n", "minmax.npz": "mine", "partition/plan.txt": "mine"}
    for name, text in mine.items():
        (home / name).write_text(text)
    model = DIGITS / "digits.onnx"
    with pytest.raises(UserError, match=r"home: cannot be the session workspace: it holds '.bas"):
        Session(model, workspace=home, input_shapes=SHAPES)
    assert {name: (home / name).read_text() for name in mine} == mine
    (home / ".bashrc").unlink()  # only names a workspace uses: still the user's folder
    (home / "records").mkdir()
    (home / "records" / "calib_batch.npz").write_text("mine")
    with pytest.raises(UserError, match="is not one .no .onebuild-workspace mark"):
        Session(model, workspace=home, input_shapes=SHAPES)
    assert (home / "minmax.npz").read_text() == "mine"
    assert (home / "records" / "calib_batch.npz").read_text() == "mine"
    with pytest.raises(UserError, match="folder .*missing does not exist; onebuild creates no"):
        Session(model, workspace=tmp_path / "missing" / "ws", input_shapes=SHAPES)
    assert not (tmp_path / "missing").exists()
    # its own workspace, with the temporaries of a killed write, it opens and sweeps
    session = recorded(tmp_path / "ws", images)
    (tmp_path / "ws" / ".minmax.npz.x1y2.tmp").write_bytes(b"torn")
    (tmp_path / "ws" / "records" / f".{RECORDS:06d}.npz.x1y2.tmp").write_bytes(b"torn")
    again = Session(model, workspace=tmp_path / "ws", input_shapes=SHAPES)
    assert again.minmax_records == session.minmax_records == RECORDS
    assert sorted(p.name for p in (tmp_path / "ws").rglob(".*")) == [".onebuild-workspace"]


@pytest.mark.parametrize(
    ("config", "message"),
    [({"ODC_TARGET": "npu"}, "ODC_TARGET 'npu' is not an installed target (installed: "),
     ({"ODC_HW": "trix-x"}, "ODC_HW 'trix-x' is not a preset of target trix_sim (its presets:")],
)  # fmt: skip
def test_a_package_config_naming_no_installed_target_is_refused_on_open(tmp_path, config, message):
    from onebuild.packing import write_package

    model = tmp_path / "digits.obir"
    assert main(["import", str(DIGITS / "digits.onnx"), "--input-shape", "input=1,1,8,8",
                 "-o", str(model)]) == 0  # fmt: skip
    write_package(tmp_path / "p.nnpkg", [model], config={"ODC_AUTO_COMPILE": 1, **config})
    with pytest.raises(UserError, match=re.escape(f"p.nnpkg: config.cfg: {message}")):
        Session(tmp_path / "p.nnpkg", workspace=tmp_path / "ws")
    assert not (tmp_path / "ws").exists()
