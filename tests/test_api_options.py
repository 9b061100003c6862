"""The compile API's options refuse values the recipe refuses (one set of allowed values), and
quantize/partition/calibrate refuse missing data with one typed line instead of a traceback
or a silent skip. On the trained digits example."""

import copy
import re
import typing
from pathlib import Path

import pytest

from onebuild import compile as api
from onebuild import option_values as allowed
from onebuild.errors import OptionError, UserError
from onebuild.graph_ir.serde import load_model
from onebuild.npz import read_npz
from onebuild.recipe import (
    CodegenStep,
    PartitionStep,
    QuantizeLayer,
    QuantizeMixedPrecision,
    QuantizeStep,
)

EXAMPLE = Path(__file__).parent.parent / "examples" / "digits"

TYPOS = [  # the new user's typos, then one per remaining option
    (api.QuantizeOptions, "granularity", "chanel", allowed.GRANULARITIES),
    (api.QuantizeOptions, "mode", "fulll", allowed.QUANT_MODES),
    (api.QuantizeOptions, "bias_correction", "yes", allowed.BIAS_CORRECTIONS),
    (api.QuantizeOptions, "activation_granularity", "channels", allowed.ACTIVATION_GRANULARITIES),
    (api.QuantizeOptions, "weight_rounding", "ada", allowed.WEIGHT_ROUNDINGS),
    (api.QuantizeOptions, "input_type", "uint", allowed.IO_TYPES),
    (api.QuantizeOptions, "output_type", "float", allowed.IO_TYPES),
    (api.QuantizeOptions, "dtype", "int4", allowed.QUANT_DTYPES),
    (api.PartitionOptions, "strategy", "costt", allowed.STRATEGIES),
    (api.PartitionOptions, "cpu_precision", "floatt", allowed.CPU_PRECISIONS),
    (api.PartitionOptions, "comply", "names", allowed.COMPLY),
    (api.CalibrationOptions, "method", "min_max", allowed.CALIBRATION_METHODS),
    (api.MixedPrecisionOptions, "dtype", "int8", allowed.MIXED_DTYPES),
    (api.CodegenOptions, "pref", "speed", allowed.PREFS),
]


@pytest.mark.parametrize(("cls", "option", "value", "values"), TYPOS)
def test_a_wrong_option_value_is_one_line_naming_the_option_and_the_allowed_values(
    cls, option, value, values
):
    with pytest.raises(OptionError) as error:
        cls(**{option: value})
    text = str(error.value)
    assert isinstance(error.value, UserError) and isinstance(error.value, ValueError)
    assert "\n" not in text and f"{cls.__name__}.{option}" in text and repr(value) in text
    assert all(repr(v) in text for v in values), text
    cls(**{option: values[-1]})  # every allowed value is taken


@pytest.mark.parametrize(
    ("cls", "settings", "fragment"),
    [
        (api.CalibrationOptions, {"max_percentile": 101}, "max_percentile"),
        (api.CalibrationOptions, {"min_samples": 0}, "min_samples"),
        (api.CalibrationOptions, {"moving_avg_const": 0}, "above 0"),
        (api.MixedPrecisionOptions, {"samples": 0}, "samples"),
        (api.MixedPrecisionOptions, {"max_high_precision_mac_fraction": 2}, "mac_fraction"),
        (api.QuantizeOptions, {"layers": ({"names": ["a"], "dtype": "int4"},)}, "layers[0]"),
        (api.QuantizeOptions, {"layers": ({"name": ["a"]},)}, "names"),
    ],
)
def test_out_of_range_values_and_bad_layers_are_refused(cls, settings, fragment):
    with pytest.raises(OptionError, match=re.escape(fragment)):
        cls(**settings)


def test_the_recipe_takes_exactly_the_values_the_options_take():
    def literal(model, name):
        annotation = model.model_fields[name].annotation
        args = typing.get_args(annotation)
        return args if typing.get_origin(annotation) is typing.Literal else typing.get_args(args[0])

    assert literal(QuantizeStep, "mode") == allowed.QUANT_MODES
    assert literal(QuantizeStep, "dtype") == allowed.QUANT_DTYPES
    assert literal(QuantizeStep, "input_type") == allowed.IO_TYPES
    assert literal(QuantizeStep, "weight_rounding") == allowed.WEIGHT_ROUNDINGS
    assert literal(QuantizeStep, "method") == allowed.CALIBRATION_METHODS
    bias = typing.get_args(QuantizeStep.model_fields["bias_correction"].annotation)
    assert (bool, typing.Literal[allowed.EMPIRICAL]) == bias
    assert literal(QuantizeLayer, "dtype") == allowed.LAYER_DTYPES
    assert literal(QuantizeMixedPrecision, "dtype") == allowed.MIXED_DTYPES
    assert literal(PartitionStep, "cpu_precision") == allowed.CPU_PRECISIONS
    assert literal(CodegenStep, "pref") == allowed.PREFS


@pytest.fixture(scope="module")
def digits():
    model = api.optimize(load_model(EXAMPLE / "digits.onnx", {"input": [1, 1, 8, 8]}))
    calib = read_npz(EXAMPLE / "data" / "calib.npz")
    evaluation = read_npz(EXAMPLE / "data" / "eval.npz")
    return model, calib, evaluation, api.calibrate(model.main, calib)


def test_quantize_without_statistics_says_how_to_get_them(digits):
    with pytest.raises(UserError, match="calibrate"):
        api.quantize(copy.deepcopy(digits[0]))


def test_mixed_precision_without_samples_is_refused_not_claimed(digits):
    model, _, evaluation, stats = digits
    options = api.QuantizeOptions(mixed_precision=api.MixedPrecisionOptions(target_sqnr_db=200))
    with pytest.raises(UserError, match="samples"):
        api.quantize(copy.deepcopy(model), options, stats)
    measured = api.quantize(copy.deepcopy(model), options, stats, [evaluation])
    record = typing.cast(str, measured.metadata["mixed_precision"])
    assert '"target_met": false' in record  # 200 dB is out of reach, and said so


@pytest.mark.parametrize(
    "settings", [{"bias_correction": "empirical"}, {"weight_rounding": "adaround"}]
)
def test_learned_settings_without_samples_are_refused_not_skipped(digits, settings):
    model, _, _, stats = digits
    with pytest.raises(UserError, match="fit="):
        api.quantize(copy.deepcopy(model), api.QuantizeOptions(**settings), stats)


def test_quantize_works_in_place_as_its_docstring_says(digits):
    model = copy.deepcopy(digits[0])
    assert api.quantize(model, api.QuantizeOptions(), digits[3]) is model
    assert "in place" in api.quantize.__doc__.lower()


def test_float_cpu_parts_need_the_float_graph(digits):
    model = api.quantize(copy.deepcopy(digits[0]), api.QuantizeOptions(), digits[3])
    options = api.PartitionOptions(cpu_precision="float", opcode={"Gemm": "cpu"})
    with pytest.raises(UserError, match="float_graph"):
        api.partition(model.main, "digits", options)


def test_calibrating_on_zero_samples_is_one_line(digits):
    model, calib, _, _ = digits
    with pytest.raises(UserError, match="0 samples"):
        api.calibrate(model.main, {"input": calib["input"][:0]})


@pytest.mark.parametrize(
    "make",
    [
        lambda: api.MixedPrecisionOptions(target_sqnr_db=30, samples=2.5),
        lambda: api.MixedPrecisionOptions(target_sqnr_db=float("nan")),
        lambda: api.CalibrationOptions(moving_avg_batch=1.5),
        lambda: api.CalibrationOptions(min_samples=1.5),
        lambda: api.CalibrationOptions(min_percentile=90, max_percentile=10),
    ],
)
def test_whole_numbers_nan_and_percentile_order_are_checked_as_the_recipe_does(make):
    with pytest.raises(OptionError):
        make()
