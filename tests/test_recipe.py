"""Recipe validation: presets, overrides, and one-line errors with location."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from onebuild.errors import UserError
from onebuild.recipe import json_schema, load_recipe, read_recipe

ROOT = Path(__file__).parent.parent
MODEL = ROOT / "examples" / "models" / "tiny_mobilenet.onnx"


@pytest.mark.parametrize(
    "path",
    sorted((ROOT / "examples").glob("*.toml")) + sorted((ROOT / "recipes").glob("*.toml")),
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_shipped_recipes_and_presets_validate(path):
    read_recipe(path)
    if path.parent.name == "examples":
        assert "import" in load_recipe(path).steps


@pytest.fixture
def workspace(tmp_path):
    shutil.copy(MODEL, tmp_path / "model.onnx")
    (tmp_path / "calib.npz").write_bytes(b"")
    return tmp_path


def write(folder: Path, text: str, name: str = "r.toml") -> Path:
    path = folder / name
    path.write_text(text)
    return path


def test_plan_normalizes_paths_and_defaults(workspace):
    path = write(
        workspace, '[import]\nsource = "model.onnx"\n[optimize]\n[pack]\noutput = "o/p.nnpkg"\n'
    )
    plan = load_recipe(path)
    assert list(plan.steps) == ["import", "optimize", "pack"]
    assert plan.steps["import"]["source"] == str(workspace / "model.onnx")
    assert plan.steps["optimize"] == {"preset": "O1"}
    assert plan.steps["pack"]["output"] == str(workspace / "o" / "p.nnpkg")
    assert plan.build_dir == workspace / "build" / "r"


def test_extends_merges_and_overrides_win(workspace):
    write(workspace, '[quantize]\ndtype = "int16"\nmethod = "percentile"\n', "base.toml")
    path = write(
        workspace,
        'extends = "base.toml"\n[import]\nsource = "model.onnx"\n'
        '[quantize]\nmethod = "minmax"\ncalibration = "calib.npz"\n',
    )
    plan = load_recipe(path)
    assert plan.steps["quantize"]["dtype"] == "int16"
    assert plan.steps["quantize"]["method"] == "minmax"
    plan = load_recipe(
        path, ["quantize.dtype=uint8", "quantize.layers=[{names=['a'], dtype='int16'}]"]
    )
    assert plan.steps["quantize"]["dtype"] == "uint8"
    assert plan.steps["quantize"]["layers"][0]["dtype"] == "int16"


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ('[import]\nsource = "model.onnx"\n[quantize\n', ["TOML syntax error", "line 3"]),
        (
            '[import]\nsource = "model.onnx"\n[quantize]\ndtyp = "int8"\n',
            ["quantize.dtyp", "unknown key", "did you mean 'dtype'"],
        ),
        ('[import]\nsource = "model.onnx"\n[optimise]\n', ["optimise", "did you mean 'optimize'"]),
        (  # the misspelt key is named, not the required key it leaves missing
            '[import]\nsource = "model.onnx"\n[quantize.mixed_precision]\ntarget_sqnr = 30\n',
            ["mixed_precision.target_sqnr: unknown key", "did you mean 'target_sqnr_db'"],
        ),
        (
            '[import]\nsource = "model.onnx"\n[quantize]\ndtype = "int4"\n',
            ["quantize.dtype", "'uint8', 'int8' or 'int16'", "'int4'"],
        ),
        ('[import]\nsource = "model.onnx"\n[quantize]\nlayers = 3\n', ["quantize.layers", "list"]),
        (
            '[import]\nsource = "missing.onnx"\n',
            ["import.source", "missing.onnx", "does not exist"],
        ),
        (
            '[import]\nsource = "model.onnx"\n[pack]\noutput = "model.onnx"\n',
            ["pack.output", "would replace import.source"],
        ),
        ("[optimize]\n", ["needs an [import] table"]),
        ('extends = "r.toml"\n[import]\nsource = "model.onnx"\n', ["cycle"]),
        (
            'extends = "npu-uint9"\n[import]\nsource = "model.onnx"\n',
            ["extends: no preset named 'npu-uint9'", "npu-uint8", "path to a recipe file"],
        ),
        (
            'extends = "../base.toml"\n[import]\nsource = "model.onnx"\n',
            ["extends: no such recipe file", "base.toml"],
        ),
    ],
)
def test_bad_recipes_give_one_line_errors(workspace, text, fragments):
    path = write(workspace, text)
    with pytest.raises(UserError) as error:
        load_recipe(path)
    message = str(error.value)
    assert "\n" not in message and message.startswith(str(path))
    for fragment in fragments:
        assert fragment in message, message


def test_bad_override(workspace):
    path = write(workspace, '[import]\nsource = "model.onnx"\n')
    with pytest.raises(UserError, match="KEY.PATH=VALUE"):
        load_recipe(path, ["quantize.dtype"])
    with pytest.raises(UserError, match="quantize.dtype"):
        load_recipe(path, ["quantize.dtype=float64"])


def test_schema_lists_every_step():
    schema = json_schema()
    assert set(schema["properties"]) >= {
        "import",
        "optimize",
        "quantize",
        "partition",
        "codegen",
        "pack",
        "build",
        "extends",
    }
    assert schema["additionalProperties"] is False


def test_cli_list_and_exit_codes(workspace):
    good = write(workspace, '[import]\nsource = "model.onnx"\n[optimize]\n')
    bad = write(workspace, '[import]\nsource = "model.onnx"\n[optimize]\nlevel = 2\n', "bad.toml")
    run = [sys.executable, "-m", "onebuild.cli", "list"]
    result = subprocess.run([*run, str(good), "--json"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)[0]["steps"]["optimize"] == {"preset": "O1"}
    result = subprocess.run([*run, str(bad)], capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "optimize.level: unknown key" in result.stderr


def test_validated_plans_are_stored_and_reused_until_the_recipe_changes(workspace, monkeypatch):
    """A no-op build skips pydantic: the plan is kept in the build folder and reused while the
    merged recipe (and onebuild) is unchanged; any change, damage or missing input is seen."""
    import onebuild.recipe as recipe_module
    from onebuild.engine.ownership import claim_build_folder
    from onebuild.plan import PLAN_FILE, load_plan

    path = write(workspace, '[import]\nsource = "model.onnx"\n[optimize]\n')
    fresh = load_recipe(path)
    assert load_plan(path) == fresh  # validated; the build folder does not exist: nothing kept
    fresh.build_dir.mkdir(parents=True)
    assert load_plan(path) == fresh  # a folder that no build has claimed yet: nothing kept
    assert not (fresh.build_dir / PLAN_FILE).exists()
    claim_build_folder(fresh.build_dir, str(path))
    assert load_plan(path) == fresh
    assert (fresh.build_dir / PLAN_FILE).is_file()

    validations = []
    real = recipe_module.plan_from_data
    monkeypatch.setattr(
        recipe_module, "plan_from_data", lambda *a: validations.append(a) or real(*a)
    )
    reused = load_plan(path)
    assert reused == fresh and not validations
    assert list(reused.steps) == list(fresh.steps)  # steps chain in plan order
    assert load_plan(path, ["optimize.preset=O0"]).steps["optimize"] == {"preset": "O0"}
    assert len(validations) == 1  # an override is a different recipe
    with pytest.raises(UserError, match="optimize.presets: unknown key; did you mean 'preset'"):
        load_plan(path, ["optimize.presets=O0"])
    write(workspace, '[import]\nsource = "model.onnx"\n')
    assert "optimize" not in load_plan(path).steps
    (fresh.build_dir / PLAN_FILE).write_text("{not json")
    assert "optimize" not in load_plan(path).steps  # damaged: validated again
    count = len(validations)
    assert load_plan(path) and len(validations) == count
    (workspace / "model.onnx").unlink()
    with pytest.raises(UserError, match="import.source: .* does not exist"):
        load_plan(path)


def test_a_preset_by_name(workspace):
    """`extends = "npu-uint8"` merges the shipped preset (recipes/npu-uint8.toml) underneath."""
    text = '[import]\nsource = "model.onnx"\n[quantize]\ncalibration = "model.onnx"\n'
    plan = load_recipe(write(workspace, 'extends = "npu-uint8"\n' + text))
    assert plan.steps["codegen"]["hw"] == "trix-m"
    assert plan.steps["quantize"]["activation_granularity"] == "channel"


def test_a_tilde_in_a_path_is_the_home_folder(workspace, monkeypatch):
    """`~` made a literal `./~` folder beside the recipe."""
    home = workspace / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    path = write(
        workspace,
        '[import]\nsource = "model.onnx"\n[optimize]\n[pack]\noutput = "~/p.nnpkg"\n'
        '[build]\ndir = "~/b"\n',
    )
    plan = load_recipe(path, ["build.cache=~/cache"])
    assert plan.steps["pack"]["output"] == str(home / "p.nnpkg")
    assert plan.build_dir == home / "b" and plan.cache_dir == home / "cache"
    with pytest.raises(UserError, match="'~nosuchuser_x/c': '~' cannot be expanded"):
        load_recipe(path, ["build.cache=~nosuchuser_x/c"])


def test_a_stored_plan_is_validated_again_when_target_plugins_change(workspace):
    """plan.json holds what target plugins answered (the codegen preset, channel dtypes, the
    backends): a plugin upgraded, edited or removed makes the recipe be validated again."""
    from onebuild.engine.ownership import claim_build_folder
    from onebuild.plan import PLAN_FILE

    plugin = workspace / "plugin"
    shutil.copytree(Path(__file__).parent / "data" / "tiny_target", plugin)
    path = write(workspace, '[import]\nsource = "model.onnx"\n[codegen]\ntarget = "tiny"\n')
    build = workspace / "build" / "r"
    build.mkdir(parents=True)
    claim_build_folder(build, str(path))
    script = (
        f"from onebuild.plan import load_plan; print(load_plan({str(path)!r}).steps['codegen'])"
    )

    def plan_with(pythonpath: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "PYTHONPATH": pythonpath}
        return subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True
        )

    assert "'hw': 'tiny-1'" in plan_with(str(plugin)).stdout
    key = json.loads((build / PLAN_FILE).read_text())["key"]
    assert "'hw': 'tiny-1'" in plan_with(str(plugin)).stdout
    assert json.loads((build / PLAN_FILE).read_text())["key"] == key  # unchanged: reused
    source = plugin / "tiny_target" / "__init__.py"
    source.write_text(source.read_text() + "\n# edited\n")
    assert "'hw': 'tiny-1'" in plan_with(str(plugin)).stdout
    assert json.loads((build / PLAN_FILE).read_text())["key"] != key
    removed = plan_with("")
    assert removed.returncode == 1 and "codegen.target 'tiny' is not an installed target" in (
        removed.stderr
    )
