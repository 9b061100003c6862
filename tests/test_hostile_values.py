"""Values that used to end in a traceback or a nonsense gate: non-finite thresholds, partition
names with folders in them, external data behind a symlink loop. Each is one line naming it."""

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_api_outputs import built  # noqa: F401 (the module's fixture)

from onebuild import compile as api
from onebuild.cli import main
from onebuild.errors import OptionError, UserError
from onebuild.graph_ir.serde.onnx_wire import external_data_files
from onebuild.recipe import load_recipe

MODEL = Path(__file__).parent.parent / "examples" / "models" / "tiny_mobilenet.onnx"


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e400"])
@pytest.mark.parametrize(
    "key", ["quantize.mixed_precision.target_sqnr_db", "quantize.accuracy.min_sqnr_db"]
)
def test_a_non_finite_threshold_in_a_recipe_is_refused(tmp_path, key, value):
    (tmp_path / "model.onnx").write_bytes(MODEL.read_bytes())
    (tmp_path / "calib.npz").write_bytes(b"")
    recipe = tmp_path / "r.toml"
    recipe.write_text(
        '[import]\nsource = "model.onnx"\n[quantize]\ncalibration = "calib.npz"\n'
        '[quantize.accuracy]\ndata = "calib.npz"\n[quantize.mixed_precision]\ntarget_sqnr_db = 30\n'
    )
    load_recipe(recipe, [f"{key}=25"])
    with pytest.raises(UserError) as error:
        load_recipe(recipe, [f"{key}={value}"])
    assert "\n" not in str(error.value) and key.split(".")[-1] in str(error.value)


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_a_non_finite_target_in_the_api_is_refused(value):
    with pytest.raises(OptionError, match="target_sqnr_db: .* must be a finite number"):
        api.MixedPrecisionOptions(target_sqnr_db=value)
    api.MixedPrecisionOptions(target_sqnr_db=-5.0)


@pytest.mark.parametrize("name", ["../../escaped", "/abs/escaped", "a\0b", "..", "", "a\\b"])
def test_a_partition_name_must_be_a_plain_stem(built, tmp_path, name):  # noqa: F811
    _, quantized, parts, _ = built
    with pytest.raises(OptionError, match="partition name .*: must be a plain file name"):
        api.partition(quantized.main, name)
    renamed = dataclasses.replace(parts, name=name)
    with pytest.raises(OptionError, match="partition name"):
        renamed.save(tmp_path / "out" / "p")
    assert not any(tmp_path.rglob("*escaped*")) and not (tmp_path / "out").exists()


def _external_model(folder: Path, location: str) -> Path:
    weight = numpy_helper.from_array(np.ones((2, 2), np.float32), "w")
    weight.data_location = TensorProto.EXTERNAL
    weight.ClearField("raw_data")
    weight.external_data.add(key="location", value=location)
    node = helper.make_node("MatMul", ["x", "w"], ["y"])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])
    graph = helper.make_graph([node], "g", [x], [y], [weight])
    path = folder / "m.onnx"
    path.write_bytes(helper.make_model(graph).SerializeToString())
    return path


def test_external_data_behind_a_symlink_loop_is_one_line(tmp_path, capsys):
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    model = _external_model(tmp_path, "loop")
    assert external_data_files(model) == []
    assert main(["inspect", str(model)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "external data 'loop'" in err, err
