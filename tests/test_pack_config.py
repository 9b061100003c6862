"""`[pack] config` is checked as config.cfg will hold it: the bytes written, read back. A key or
value that would read back as something else (a line break adding a key, `#` cutting a comment)
and an ODC_HW that is not a preset of the package's target are one-line errors naming the key."""

from pathlib import Path

import pytest

from onebuild.cli import main
from onebuild.errors import FormatError
from onebuild.nnpackage import config_text, config_value, parse_config
from onebuild.odc import check_config

DIGITS = Path(__file__).parent.parent / "examples" / "digits" / "digits.onnx"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ('{ ODC_HW = "trix-m\\nODC_BACKEND=auto" }', "config key ODC_HW: value 'trix-m\\nODC"),
        ('{ ODC_TARGET = "trix_sim # comment" }', "config key ODC_TARGET: value 'trix_sim #"),
        ('{ ODC_HW = "trix-m\\r" }', "config key ODC_HW: value 'trix-m\\r'"),
        ('{ ODC_HW = " trix-m" }', "config key ODC_HW: value ' trix-m'"),
        ('{ "A=B" = "1" }', "config key 'A=B': a config.cfg key has no line break, '#', '='"),
        ('{ "A#B" = "1" }', "config key 'A#B'"),
        ('{ "A\\nODC_HW" = "1" }', "config key 'A\\nODC_HW'"),
        ('{ ODC_HW = "trix-xl" }', "ODC_HW 'trix-xl' is not a preset of target trix_sim"),
        ('{ ODC_TARGET = "nope" }', "ODC_TARGET 'nope' is not an installed target"),
    ],
)
def test_config_that_would_not_read_back_is_refused_in_one_line(tmp_path, capsys, config, message):
    recipe = tmp_path / "r.toml"
    recipe.write_text(
        f'[import]\nsource = "{DIGITS}"\n[pack]\noutput = "p.nnpkg"\nconfig = {config}\n'
    )
    assert main(["list", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pack.config" in err and message in err, err


def test_written_config_reads_back_as_given():
    config = {"ODC_AUTO_COMPILE": True, "ODC_HW": "trix-s", "ODC_MIN_SQNR_DB": 25.5, "X": "a b"}
    text = config_text({key: config_value(value) for key, value in config.items()})
    assert parse_config(text.decode(), "config.cfg") == {
        "ODC_AUTO_COMPILE": "1",
        "ODC_HW": "trix-s",
        "ODC_MIN_SQNR_DB": "25.5",
        "X": "a b",
    }
    settings = check_config(config)
    assert (settings.auto_compile, settings.hw, settings.gate) == (
        True,
        "trix-s",
        (("min_sqnr_db", 25.5),),
    )
    with pytest.raises(FormatError, match=r"^config key BACKENDS: value 'npu\\n"):
        config_text({"BACKENDS": "npu\nODC_AUTO_COMPILE=1"})  # the compile API's path too
