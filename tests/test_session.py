"""The on-device session: recording, quantization, codegen and auto-compilation on digits."""

import json

import numpy as np
import onnx
import pytest
from digits_session import DIGITS, RECORDS, SHAPES, digits_data, digits_session
from onnx import helper
from onnx_builders import make_model

from onebuild import Session
from onebuild.cli import main
from onebuild.errors import FormatError, UserError
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.passes import run_preset
from onebuild.graph_ir.serde import load_ir, load_onnx
from onebuild.npz import read_npz, write_npz
from onebuild.odc import settings_from_config


@pytest.fixture(scope="module")
def data():
    return digits_data("calib"), digits_data("test"), digits_data("test_labels", "labels")


def accuracy(run, images, labels) -> float:
    hits = [int(np.argmax(run({"input": x})["logits"]) == y) for x, y in zip(images, labels)]
    return float(np.mean(hits))


def test_digits_switches_to_the_npu_after_the_recorded_runs(tmp_path, data):
    calib, test, labels = data
    session = digits_session(tmp_path / "ws")
    reference = load_onnx(DIGITS / "digits.onnx", SHAPES)
    run_preset(reference)
    float_run = Interpreter(reference.main).run
    states = []
    for x in calib[:RECORDS]:
        assert session.state == "INITIAL"
        outputs = session.run_with_auto_compilation({"input": x})
        np.testing.assert_array_equal(outputs["logits"], float_run({"input": x})["logits"])
        states.append(session.state)
    assert states == ["INITIAL"] * (RECORDS - 1) + ["COMPILED"]
    assert session.reason is None and session.gates["compiled"]["passed"]
    out = session.run_with_auto_compilation({"input": test[0]})
    assert out["logits"].dtype == np.float32 and out["logits"].shape == (1, 10)
    float_accuracy = accuracy(float_run, test, labels)
    npu_accuracy = accuracy(session.run_with_auto_compilation, test, labels)
    assert float_accuracy - npu_accuracy <= 0.01, (float_accuracy, npu_accuracy)
    # the app restarts: the workspace has it all, nothing is recorded or rebuilt
    tvn = tmp_path / "ws" / "model.tvn"
    stamp = tvn.stat().st_mtime_ns
    again = digits_session(tmp_path / "ws")
    assert again.state == "COMPILED" and again.minmax_records == RECORDS
    np.testing.assert_array_equal(
        again.run_with_auto_compilation({"input": test[0]})["logits"], out["logits"]
    )
    assert tvn.stat().st_mtime_ns == stamp


@pytest.mark.parametrize(
    "qtype, options",
    [("U8_ASYM", 'dtype = "uint8"'), ("I16_SYM", 'dtype = "int16"'),
     ("WO_I8_SYM", 'mode = "weight_only"\ndtype = "int8"')],
)  # fmt: skip
def test_session_files_equal_what_the_build_makes(tmp_path, data, qtype, options):
    """One implementation, two front doors: the same recorded data gives the same bytes."""
    calib = data[0][:RECORDS]
    session = digits_session(tmp_path / "ws")
    session.set_quantization_type(qtype)
    for x in calib:
        session.run_with_auto_compilation({"input": x}, target="trix_sim", pref="memory")
    full = qtype != "WO_I8_SYM"
    write_npz(tmp_path / "calib.npz", {"input": calib})
    recipe = tmp_path / "r.toml"
    recipe.write_text(
        f'[import]\nsource = "{DIGITS / "digits.onnx"}"\ninput_shapes = {{ input = [1, 1, 8, 8] }}'
        f'\n[optimize]\n[quantize]\n{options}\ncalibration = "calib.npz"\n[build]\ndir = "b"\n'
        + ('[codegen]\npref = "memory"\n' if full else "")
    )
    assert main(["build", str(recipe)]) == 0
    pairs = [("model.obir", "optimize.obir"), ("quantized.obir", "quantize.obir")]
    if full:
        assert session.state == "COMPILED", session.reason
        pairs += [("minmax.npz", "calibrate.npz"), ("model.tvn", "codegen.tvn")]
    else:  # a weight-only model keeps float activations: no NPU binary
        assert session.state == "QUANTIZED" and "codegen failed" in session.reason
    ws, build = tmp_path / "ws", tmp_path / "b"
    for mine, theirs in pairs:
        assert (ws / mine).read_bytes() == (build / theirs).read_bytes(), mine


def test_a_pass_on_few_calibration_inputs_says_so(tmp_path, data, caplog):
    """The gate's inputs are the runs the ranges came from: its report says so, and a pass on
    one such run is a warning, not a silent COMPILED (it said nothing of the inputs after)."""
    session = digits_session(tmp_path / "ws", records=1)
    with caplog.at_level("WARNING", logger="onebuild"):
        session.run_with_auto_compilation({"input": data[0][0]})
    assert session.state == "COMPILED", session.reason
    assert all(report["on_calibration_inputs"] for report in session.gates.values())
    thin = [r.message for r in caplog.records if "passed the accuracy gate on only 1" in r.message]
    assert len(thin) == 2 and "the ones its ranges came from" in thin[0]  # quantized, compiled
    caplog.clear()
    wide = digits_session(tmp_path / "ws8", records=8)
    with caplog.at_level("WARNING", logger="onebuild"):
        for x in data[0][:8]:
            wide.run_with_auto_compilation({"input": x})
    assert wide.state == "COMPILED" and not any("only" in r.message for r in caplog.records)


def test_a_failed_gate_stays_on_float_and_says_why(tmp_path, data):
    calib = data[0]
    session = digits_session(tmp_path / "ws", records=4)
    session.set_accuracy_gate(min_sqnr_db=90.0)
    for x in calib[:6]:
        session.run_with_auto_compilation({"input": x})
    assert session.state == "INITIAL"
    assert "quantized model failed the accuracy gate on 4 recorded input(s)" in session.reason
    assert "sqnr_db of 'logits'" in session.reason and "(needs >= 90)" in session.reason
    assert session.minmax_records == 4  # recording stopped with the decision
    restarted = digits_session(tmp_path / "ws", records=4)
    restarted.set_accuracy_gate(min_sqnr_db=90.0)
    assert restarted.state == "INITIAL" and restarted.reason == session.reason
    # another metric and threshold: the next run decides again, from the same records
    session.set_accuracy_gate(min_top1_match=0.75)
    session.run_with_auto_compilation({"input": calib[0]})
    assert session.state == "COMPILED" and session.reason is None
    assert session.minmax_records == 4


def softmax_model(rng) -> onnx.ModelProto:
    """conv -> relu -> Softmax over the width: quantizes, but the NPU's Softmax runs over
    channels only."""
    w = rng.normal(0, 0.3, (4, 1, 3, 3)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Softmax", ["r"], ["y"], axis=3, name="softmax"),
    ]
    return make_model(nodes, [("x", [1, 1, 6, 6])], ["y"], [("w", w)])


def test_what_the_npu_lacks_stays_on_the_cpu_and_a_failed_codegen_falls_back(tmp_path, rng):
    path = tmp_path / "m.onnx"
    onnx.save(softmax_model(rng), path)
    xs = rng.random((4, 1, 1, 6, 6), dtype=np.float32)
    session = Session(path, workspace=tmp_path / "ws")
    session.set_odc_param_minmax_records_count(3)
    for x in xs[:3]:
        session.run_with_auto_compilation({"x": x})
    # conv + relu on the NPU, Softmax on the CPU: the build's partition, codegen and pack
    assert session.state == "COMPILED" and session.reason is None
    package = tmp_path / "ws" / "compiled.nnpkg"
    # the CPU part (the QSoftmax) is circle
    assert sorted(p.suffix for p in package.iterdir() if p.is_file()) == [".circle", ".tvn"]
    quantized = Interpreter(load_ir(tmp_path / "ws" / "quantized.obir").main)
    out = session.run_with_auto_compilation({"x": xs[3]})
    np.testing.assert_array_equal(out["y"], quantized.run({"x": xs[3]})["y"])
    assert out["y"].dtype == np.float32 and out["y"].shape == (1, 4, 6, 6)
    # a codegen that fails (here: a weight-only model has float activations, which NPU code
    # cannot take) leaves the quantized model running
    failing = Session(path, workspace=tmp_path / "ws2")
    failing.set_odc_param_minmax_records_count(3)
    failing.set_quantization_type("WO_I8_SYM")
    for x in xs:
        out = failing.run_with_auto_compilation({"x": x})
    assert failing.state == "QUANTIZED"
    assert failing.reason.startswith("codegen failed, staying on the quantized model")
    assert "WO_I8_SYM" in failing.reason
    assert out["y"].dtype == np.float32
    weight_only = Interpreter(load_ir(tmp_path / "ws2" / "quantized.obir").main)
    np.testing.assert_array_equal(out["y"], weight_only.run({"x": xs[3]})["y"])
    assert Session(path, workspace=tmp_path / "ws2").state == "QUANTIZED"


AUTO_SCRIPT = """
import os, sys
from onebuild import Session
from onebuild.npz import read_npz

kill_at, after = int(sys.argv[2]), sys.argv[3] == "after"
real_replace, calls = os.replace, [0]

def replace(src, dst):  # the process dies at one commit point of the workspace
    calls[0] += 1
    if calls[0] == kill_at and not after:
        os._exit(9)
    real_replace(src, dst)
    if calls[0] == kill_at:
        os._exit(9)

os.replace = replace
stream = read_npz(sys.argv[4])["input"]
session = Session(sys.argv[5], workspace=sys.argv[1], input_shapes={"input": [1, 1, 8, 8]})
session.set_odc_param_minmax_records_count(4)
while session.state != "COMPILED":  # the app's stream resumes where the session is
    session.run_with_auto_compilation({"input": stream[session.minmax_records]})
print(calls[0])
"""


def test_killed_anywhere_during_auto_compilation_ends_compiled_and_identical(tmp_path, data):
    """Kill the process before and after every atomic commit (each file the workspace writes),
    then restart: the final state and outputs equal an uninterrupted run's."""
    import subprocess
    import sys

    calib, test, _ = data
    stream = tmp_path / "stream.npz"
    write_npz(stream, {"input": calib[:8]})
    script = tmp_path / "app.py"
    script.write_text(AUTO_SCRIPT)

    def app(workspace, kill_at=0, after="before"):
        args = [sys.executable, str(script), str(workspace), str(kill_at), after, str(stream)]
        return subprocess.run([*args, str(DIGITS / "digits.onnx")], capture_output=True, text=True)

    clean = app(tmp_path / "clean")
    assert clean.returncode == 0, clean.stderr
    commits = int(clean.stdout)
    reference = digits_session(tmp_path / "clean", records=4)
    expected = reference.run({"input": test[0]})["logits"]
    files = sorted(p.name for p in (tmp_path / "clean").iterdir())
    for kill_at in range(1, commits + 1):
        for after in ("before", "after"):
            workspace = tmp_path / f"ws{kill_at}{after}"
            killed = app(workspace, kill_at, after)
            assert killed.returncode == 9, (kill_at, after, killed.stderr)
            resumed = app(workspace)
            assert resumed.returncode == 0, (kill_at, after, resumed.stderr)
            session = digits_session(workspace, records=4)
            assert session.state == "COMPILED"
            assert sorted(p.name for p in workspace.iterdir()) == files
            np.testing.assert_array_equal(session.run({"input": test[0]})["logits"], expected)
            for name in ("minmax.npz", "quantized.obir", "model.tvn"):
                assert (workspace / name).read_bytes() == (tmp_path / "clean" / name).read_bytes()


def test_the_package_config_turns_auto_compilation_on(tmp_path, data):
    calib, test, _ = data
    recipe = tmp_path / "odc.toml"
    recipe.write_text(
        f'[import]\nsource = "{DIGITS / "digits.onnx"}"\ninput_shapes = {{ input = [1, 1, 8, 8] }}'
        '\n[optimize]\n[pack]\noutput = "digits.nnpkg"\n'
        "config = { ODC_AUTO_COMPILE = true, ODC_MINMAX_RECORDS = 5, ODC_MIN_SQNR_DB = 30 }\n"
        '[build]\ndir = "b"\n'
    )
    assert main(["build", str(recipe)]) == 0
    config = (tmp_path / "digits.nnpkg" / "metadata" / "config.cfg").read_text()
    assert "ODC_AUTO_COMPILE=1\n" in config and "ODC_MINMAX_RECORDS=5\n" in config
    session = Session(tmp_path / "digits.nnpkg", workspace=tmp_path / "ws")
    assert session.settings.auto_compile and session.settings.gate == (("min_sqnr_db", 30.0),)
    for x in calib[:5]:
        session.run({"input": x})  # the app only loads and runs
    assert session.state == "COMPILED", session.reason
    assert session.run({"input": test[0]})["logits"].dtype == np.float32


def test_unknown_odc_keys_are_reported_with_a_suggestion(tmp_path, capsys):
    with pytest.raises(FormatError, match="unknown key ODC_MINMAX_RECORD; did you mean ODC_MIN"):
        settings_from_config({"ODC_MINMAX_RECORD": "3"}, "config.cfg")
    with pytest.raises(FormatError, match="ODC_MINMAX_RECORDS=many is not a valid int"):
        settings_from_config({"ODC_MINMAX_RECORDS": "many"}, "config.cfg")
    with pytest.raises(FormatError, match="quant_type 'U4' is not one of U8_ASYM"):
        settings_from_config({"ODC_QUANT_TYPE": "U4"}, "config.cfg")
    recipe = tmp_path / "r.toml"
    recipe.write_text(
        f'[import]\nsource = "{DIGITS / "digits.onnx"}"\n[pack]\noutput = "p"\n'
        "config = { ODC_AUTO_COMPILES = 1 }\n"
    )
    assert main(["build", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert "pack.config" in err and "did you mean ODC_AUTO_COMPILE" in err


@pytest.mark.parametrize("requirement", ["performance", "memory"])
def test_auto_backend_picks_by_the_requirement(tmp_path, data, requirement):
    session = digits_session(tmp_path / "ws", records=6)
    session.set_backend("auto", requirement)
    for x in data[0][:6]:
        session.run_with_auto_compilation({"input": x})
    choice = session.choice
    key = "microseconds" if requirement == "performance" else "memory_bytes"
    estimates = choice["estimates"]
    assert set(estimates) == {"INITIAL", "QUANTIZED", "COMPILED"}
    assert choice["chosen"] == min(estimates, key=lambda s: estimates[s][key])
    assert session.state == choice["chosen"]
    assert estimates["INITIAL"]["memory_bytes"] > estimates["QUANTIZED"]["memory_bytes"]


def test_the_nnfw_flow_by_hand(tmp_path, data):
    calib, test, _ = data
    session = digits_session(tmp_path / "ws")
    session.prepare()
    with pytest.raises(UserError, match="needs recorded ranges"):
        session.quantize()
    session.set_execute_config("DUMP_MINMAX")
    output = np.zeros((1, 10), np.float32)
    session.set_output(0, output)
    for x in calib[:5]:
        session.set_input("input", x)
        result = session.run()
        np.testing.assert_array_equal(output, result["logits"])
    session.reset_execute_config()
    assert session.minmax_records == 5
    session.set_quantization_type("U8_ASYM")
    session.set_quantized_model_path(tmp_path / "digits.q.obir")
    assert session.quantize() == tmp_path / "digits.q.obir"
    assert session.state == "QUANTIZED"
    quantized = session.run({"input": test[0]})["logits"]
    session.set_codegen_model_path(tmp_path / "digits.tvn")
    assert session.codegen("trix_sim", "performance") == tmp_path / "digits.tvn"
    assert session.state == "COMPILED"
    np.testing.assert_array_equal(session.run({"input": test[0]})["logits"], quantized)
    with pytest.raises(UserError, match="input 'input' has shape \\[8, 8\\], expected"):
        session.run({"input": test[0][0, 0]})
    weight_only = digits_session(tmp_path / "wo")
    weight_only.set_quantization_type("WO_I8_SYM")
    weight_only.quantize()  # weight-only needs no recorded ranges
    assert weight_only.state == "QUANTIZED"
    assert weight_only.run({"input": test[0]})["logits"].dtype == np.float32


def test_a_changed_model_starts_the_workspace_over(tmp_path, data, rng):
    session = digits_session(tmp_path / "ws", records=3)
    for x in data[0][:3]:
        session.run_with_auto_compilation({"input": x})
    assert session.state == "COMPILED"
    path = tmp_path / "m.onnx"
    onnx.save(softmax_model(rng), path)
    other = Session(path, workspace=tmp_path / "ws")
    assert other.state == "INITIAL" and other.minmax_records == 0
    assert not (tmp_path / "ws" / "model.tvn").exists()


def test_a_tampered_binary_is_rebuilt_not_trusted(tmp_path, data):
    session = digits_session(tmp_path / "ws", records=3)
    for x in data[0][:3]:
        session.run_with_auto_compilation({"input": x})
    tvn = tmp_path / "ws" / "model.tvn"
    good = tvn.read_bytes()
    tvn.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    again = digits_session(tmp_path / "ws", records=3)
    assert again.state == "QUANTIZED"
    again.run_with_auto_compilation({"input": data[1][0]})
    assert again.state == "COMPILED" and tvn.read_bytes() == good
    state = json.loads((tmp_path / "ws" / "state.json").read_text())
    assert state["artifacts"]["compiled"]["path"] == "model.tvn"


def test_cli_runs_onert_run_style(tmp_path, data, capsys, monkeypatch):
    inputs = tmp_path / "x.npz"
    write_npz(inputs, {"input": data[1][:12]})
    model = str(DIGITS / "digits.onnx")
    common = ["--input-shape", "input=1,1,8,8", "-i", str(inputs)]
    monkeypatch.chdir(tmp_path)
    manual = ["--workspace", "ws", "-o", "y.npz", "--quantize", "uint8", "--qpath", "q.obir",
              "--minmax-runs", "10", "--codegen", "trix_sim", "--cpath", "m.tvn"]  # fmt: skip
    code = main(["run", model, *common, *manual])
    assert code == 0 and (tmp_path / "q.obir").is_file() and (tmp_path / "m.tvn").is_file()
    assert "state: COMPILED" in capsys.readouterr().out
    auto = ["--workspace", "auto", "-o", "z.npz", "--auto-compile", "--minmax-runs", "4"]
    assert main(["run", model, *common, *auto]) == 0
    assert "run 4: switched INITIAL -> COMPILED" in capsys.readouterr().out
    manual, auto = read_npz(tmp_path / "y.npz")["logits"], read_npz(tmp_path / "z.npz")["logits"]
    assert manual.shape == auto.shape == (12, 1, 10) and manual.dtype == np.float32
    assert main(["run", model, *common, "-o", "w.npz", "--quantize", "uint8", "--raw"]) == 2


def test_the_example_app_switches_to_the_npu(tmp_path):
    import subprocess
    import sys

    examples = DIGITS.parent
    package = tmp_path / "digits_odc.nnpkg"
    overrides = ["--set", f"pack.output={package}", "--set", f"build.dir={tmp_path / 'b'}"]
    assert main(["build", str(examples / "digits_odc.toml"), *overrides]) == 0
    script = [sys.executable, str(examples / "on_device.py"), str(package)]
    first = subprocess.run(script, capture_output=True, text=True, check=True).stdout
    assert "run 32: INITIAL -> COMPILED" in first
    second = subprocess.run(script, capture_output=True, text=True, check=True).stdout
    assert "state COMPILED, 32 runs recorded" in second and "COMPILED: 360 runs" in second
    compiled = float(second.split("accuracy ")[-1].rstrip("%\n")) / 100
    assert compiled >= 0.968  # float: 97.8 % on the same 360 test images


def test_non_finite_inputs_are_not_recorded_and_not_quantized(tmp_path, data, caplog):
    """NaN or infinity: a float run still answers but is not recorded (it would poison the
    ranges); a quantized or compiled model refuses it, naming the input and the position."""
    calib = data[0]
    session = digits_session(tmp_path / "ws", records=3)
    bad = calib[0].copy()
    bad[0, 0, 2, 5] = np.nan
    out = session.run_with_auto_compilation({"input": bad})
    assert np.isnan(out["logits"]).all() and session.minmax_records == 0
    assert "not recorded" in caplog.text
    for x in calib[:3]:
        session.run_with_auto_compilation({"input": x})
    assert session.state == "COMPILED"
    with pytest.raises(
        UserError, match=r"input 'input' contains NaN or Inf \(nan at \[0, 0, 2, 5\]"
    ):
        session.run_with_auto_compilation({"input": bad})


def test_explicit_codegen_partitions_or_records_why_not(tmp_path, rng):
    """Explicit codegen behaves like auto-compilation: a model the NPU cannot run whole is
    partitioned; asked for one whole-model binary, it fails and says why (session.reason)."""
    path = tmp_path / "m.onnx"
    onnx.save(softmax_model(rng), path)
    xs = rng.random((2, 1, 1, 6, 6), dtype=np.float32)
    session = Session(path, workspace=tmp_path / "ws")
    session.set_execute_config("DUMP_MINMAX")
    session.run({"x": xs[0]})
    session.reset_execute_config()
    session.quantize()
    quantized = session.run({"x": xs[1]})["y"]
    assert session.codegen("trix_sim") == tmp_path / "ws" / "compiled.nnpkg"
    assert session.state == "COMPILED" and session.reason is None
    np.testing.assert_array_equal(session.run({"x": xs[1]})["y"], quantized)

    whole = Session(path, workspace=tmp_path / "ws2")
    whole.set_execute_config("DUMP_MINMAX")
    whole.run({"x": xs[0]})
    whole.reset_execute_config()
    whole.quantize()
    whole.set_codegen_model_path(tmp_path / "m.tvn")
    with pytest.raises(UserError, match="Softmax must run over axis 1.*partitions the model"):
        whole.codegen("trix_sim")
    assert whole.state == "QUANTIZED" and "Softmax" in whole.reason
    assert not (tmp_path / "m.tvn").exists()


def test_cli_explicit_codegen_partitions(tmp_path, rng, capsys):
    path = tmp_path / "m.onnx"
    onnx.save(softmax_model(rng), path)
    write_npz(tmp_path / "x.npz", {"x": rng.random((3, 1, 1, 6, 6), dtype=np.float32)})
    args = ["run", str(path), "-i", str(tmp_path / "x.npz"), "-o", str(tmp_path / "y.npz")]
    assert main([*args, "--quantize", "uint8", "--codegen", "trix_sim"]) == 0
    printed = capsys.readouterr().out
    assert "compiled.nnpkg" in printed and "state: COMPILED" in printed
    cpath = ["--cpath", str(tmp_path / "m.tvn")]
    code = main([*args, "--quantize", "uint8", "--codegen", "trix_sim", *cpath])
    assert code == 2
