"""A recipe's [codegen] target and hardware preset are checked when it loads: a typo fails
`onebuild list` and a build in one line, before any step runs, not in codegen after five."""

from pathlib import Path

import pytest

from onebuild.cli import main

DIGITS = Path(__file__).parent.parent / "examples" / "digits"
RECIPE = """
[import]
source = "{model}"
input_shapes = {{ input = [1, 1, 8, 8] }}
[quantize]
calibration = "{calib}"
[codegen]
{codegen}
"""


@pytest.mark.parametrize(
    "codegen, message",
    [
        ('hw = "trix-q"', "codegen.hw 'trix-q' is not a preset of target trix_sim (its presets: "),
        ('target = "npu"', "codegen.target 'npu' is not an installed target (installed: "),
    ],
)
def test_a_wrong_target_or_preset_fails_before_any_step(tmp_path, capsys, codegen, message):
    recipe = tmp_path / "r.toml"
    calib = DIGITS / "data" / "calib.npz"
    recipe.write_text(RECIPE.format(model=DIGITS / "digits.onnx", calib=calib, codegen=codegen))
    for command in ("list", "build"):
        assert main([command, str(recipe)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{recipe}: {message}" in err[0], err
    assert not (tmp_path / "build").exists()
