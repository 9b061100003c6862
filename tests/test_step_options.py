"""The quantize and calibrate steps take their option names from the compile API's dataclasses:
an option added there reaches the step (and its cache key) or fails loudly, never silently."""

from dataclasses import dataclass, fields
from pathlib import Path

import pytest

from onebuild.compile import CalibrationOptions, QuantizeOptions
from onebuild.recipe import load_recipe
from onebuild.tasks import calibrate, quantize

DIGITS = Path(__file__).parent.parent / "examples" / "digits"


@pytest.fixture
def table(tmp_path) -> dict:
    """The [quantize] table of a validated recipe, every default filled in."""
    recipe = tmp_path / "r.toml"
    recipe.write_text(
        f'[import]\nsource = "{DIGITS / "digits.onnx"}"\n[quantize]\n'
        f'calibration = "{DIGITS / "data" / "calib.npz"}"\n'
    )
    return load_recipe(recipe).steps["quantize"]


def test_every_option_reaches_its_step(table):
    config = quantize.step_config(table)
    assert {f.name for f in fields(QuantizeOptions)} - {"channel_dtypes"} <= set(config)
    for method in ("minmax", "percentile", "moving_average", "mse"):
        config = calibrate.step_config({**table, "method": method})
        others = {k for m, keys in calibrate.METHOD_KEYS.items() if m != method for k in keys}
        assert {f.name for f in fields(CalibrationOptions)} - others <= set(config)
        assert not others & set(config)  # another method's options do not invalidate


@dataclass(frozen=True)
class _NewQuantize(QuantizeOptions):
    new_option: int = 0


@dataclass(frozen=True)
class _NewCalibration(CalibrationOptions):
    new_option: int = 0


def test_an_option_added_to_the_dataclass_is_in_the_step_config_or_an_error(monkeypatch, table):
    monkeypatch.setattr(quantize, "QuantizeOptions", _NewQuantize)
    monkeypatch.setattr(calibrate, "CalibrationOptions", _NewCalibration)
    for step in (quantize, calibrate):
        assert step.step_config({**table, "new_option": 3})["new_option"] == 3
        with pytest.raises(KeyError, match="new_option"):  # the recipe forgot it: loud
            step.step_config(table)
