"""The cached build DAG with real files and the real doit database."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from onebuild.engine import cache_folder
from onebuild.engine.dag import build
from onebuild.errors import UserError
from onebuild.recipe import load_recipe

MODEL = Path(__file__).parent.parent / "examples" / "models" / "tiny_mobilenet.onnx"
RECIPE = """
[import]
source = "model.onnx"
input_shapes = { x = [1, 3, 32, 32] }
[optimize]
preset = "O1"
[pack]
output = "out/m.nnpkg"
"""


@pytest.fixture
def project(tmp_path):
    shutil.copy(MODEL, tmp_path / "model.onnx")
    (tmp_path / "r.toml").write_text(RECIPE)
    return tmp_path


def run(project: Path, *overrides: str) -> dict[str, str]:
    plan = load_recipe(project / "r.toml", list(overrides))
    return {r.step: r.status for r in build([plan], progress=lambda message: None)}


def test_first_build_then_noop(project):
    assert run(project) == {"import": "run", "optimize": "run", "pack": "run"}
    assert run(project) == {"import": "up-to-date", "optimize": "up-to-date", "pack": "up-to-date"}
    manifest = json.loads((project / "out/m.nnpkg/metadata/MANIFEST").read_text())
    assert manifest["models"] == ["m.circle"] and manifest["minor-version"] == "3"
    assert manifest["model-types"] == ["circle"]
    log = json.loads((project / "build/r/optimize.obir.log").read_text())
    assert log["step"] == "optimize" and all(log["outputs"].values())


def test_option_change_reruns_only_downstream(project):
    run(project)
    assert run(project, "optimize.preset=O0") == {
        "import": "up-to-date",
        "optimize": "run",
        "pack": "run",
    }


def test_touch_without_change_runs_nothing(project):
    run(project)
    source = project / "model.onnx"
    os.utime(source, (source.stat().st_atime + 100, source.stat().st_mtime + 100))
    assert set(run(project).values()) == {"up-to-date"}


def test_identical_output_stops_the_cascade(project):
    run(project)
    # Dropping input_shapes changes import's config, but the dynamic batch defaults to 1:
    # the same graph, byte-identical IR, so nothing downstream reruns.
    (project / "r.toml").write_text(RECIPE.replace("input_shapes = { x = [1, 3, 32, 32] }\n", ""))
    statuses = run(project)  # dynamic batch defaults to 1: same graph, same bytes
    assert statuses == {"import": "run", "optimize": "up-to-date", "pack": "up-to-date"}


def test_deleted_artifact_rebuilds_only_itself(project):
    run(project)
    (project / "build/r/import.obir").unlink()
    assert run(project) == {"import": "restored", "optimize": "up-to-date", "pack": "up-to-date"}
    shutil.rmtree(project / "out")
    shutil.rmtree(project / "build/r/cache")
    assert run(project) == {"import": "up-to-date", "optimize": "up-to-date", "pack": "run"}


def test_archive_is_deterministic(project, tmp_path):
    import zipfile

    run(project, "pack.archive=true")
    archive = project / "out" / "m.nnpkg.zip"
    first = archive.read_bytes()
    with zipfile.ZipFile(archive) as opened:
        assert "m.nnpkg/metadata/MANIFEST" in opened.namelist()
    shutil.rmtree(project / "out")
    shutil.rmtree(project / "build")
    run(project, "pack.archive=true")
    assert archive.read_bytes() == first


def test_switching_an_option_back_restores_from_the_step_cache(project):
    run(project)
    first = (project / "build/r/optimize.obir").read_bytes()
    assert run(project, "optimize.preset=O0")["optimize"] == "run"
    assert run(project) == {"import": "up-to-date", "optimize": "restored", "pack": "restored"}
    assert (project / "build/r/optimize.obir").read_bytes() == first
    log = json.loads((project / "build/r/optimize.obir.log").read_text())
    assert log["status"] == "restored"


def test_shared_cache_restores_in_a_fresh_checkout(tmp_path):
    """A CI job restoring the cache folder rebuilds nothing from scratch."""
    cache = tmp_path / "shared-cache"
    statuses = []
    for name in ("first", "second"):
        folder = tmp_path / name
        folder.mkdir()
        shutil.copy(MODEL, folder / "model.onnx")
        (folder / "r.toml").write_text(RECIPE + f'[build]\ncache = "{cache}"\n')
        statuses.append(run(folder))
    assert set(statuses[0].values()) == {"run"}
    assert set(statuses[1].values()) == {"restored"}


def test_a_cache_set_after_the_build_is_filled_by_the_next_one(tmp_path):
    """A clone built before `build.cache` was set publishes its up-to-date steps on the next
    build (which runs nothing), so a fresh clone restores them all."""
    cache = tmp_path / "shared-cache"
    first, second = tmp_path / "first", tmp_path / "second"
    for folder in (first, second):
        folder.mkdir()
        shutil.copy(MODEL, folder / "model.onnx")
        (folder / "r.toml").write_text(RECIPE)
    assert set(run(first).values()) == {"run"}
    shared = f"build.cache={json.dumps(str(cache))}"
    assert set(run(first, shared).values()) == {"up-to-date"}
    assert set(run(second, shared).values()) == {"restored"}
    packages = [f / "out/m.nnpkg/m.circle" for f in (first, second)]
    assert packages[0].read_bytes() == packages[1].read_bytes()


def test_a_cache_that_cannot_be_written_does_not_fail_a_no_op_build(tmp_path, caplog):
    """An up-to-date build whose cache cannot take entries (here: file names in the way of its
    shard folders) warns and succeeds, as before caches were filled by up-to-date steps."""
    shutil.copy(MODEL, tmp_path / "model.onnx")
    (tmp_path / "r.toml").write_text(RECIPE)
    assert set(run(tmp_path).values()) == {"run"}
    blocked = tmp_path / "blocked"
    cache_folder.claim(blocked, "test")  # a cache of onebuild's (a foreign folder is refused)
    for shard in range(256):
        (blocked / f"{shard:02x}").write_text("")
    assert set(run(tmp_path, f"build.cache={json.dumps(str(blocked))}").values()) == {"up-to-date"}
    assert any("not stored" in record.getMessage() for record in caplog.records)


def test_partition_without_codegen_is_rejected_before_running(project):
    (project / "r.toml").write_text(RECIPE + "[partition]\n")
    with pytest.raises(UserError, match=r"\[partition\] needs a \[codegen\] table"):
        run(project)
    assert not (project / "build").exists()


def test_same_recipe_in_two_folders_gives_identical_packages(tmp_path):
    packages = []
    for name in ("a", "b"):
        folder = tmp_path / name / "deeper" if name == "b" else tmp_path / name
        folder.mkdir(parents=True)
        shutil.copy(MODEL, folder / "model.onnx")
        (folder / "r.toml").write_text(RECIPE)
        run(folder)
        packages.append(folder / "out/m.nnpkg")
    files = sorted(p.relative_to(packages[0]) for p in packages[0].rglob("*") if p.is_file())
    assert files == sorted(
        p.relative_to(packages[1]) for p in packages[1].rglob("*") if p.is_file()
    )
    for name in files:
        assert (packages[0] / name).read_bytes() == (packages[1] / name).read_bytes()


def test_corrupt_database_is_recovered(project):
    run(project)
    (project / "build/r/tasks.sqlite3").write_bytes(b"garbage" * 100)
    statuses = run(project)
    # doit's state is lost; the step logs still prove every output current (same cache key)
    assert set(statuses.values()) == {"up-to-date"}
    assert any(p.name.startswith("tasks.sqlite3.corrupt") for p in (project / "build/r").iterdir())
    assert set(run(project).values()) == {"up-to-date"}


def test_cli_build_json_and_failure_exit_code(project):
    cli = [sys.executable, "-m", "onebuild.cli", "build", str(project / "r.toml"), "--json"]
    result = subprocess.run(cli, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [s["status"] for s in report["steps"]] == ["run", "run", "run"]
    assert report["packages"] == [str(project / "out/m.nnpkg")]
    (project / "model.onnx").write_bytes(b"not a model")
    result = subprocess.run(cli, capture_output=True, text=True)
    assert result.returncode == 2  # bad input, as in every other command
    assert json.loads(result.stdout)["steps"][0]["status"] == "failed"
    assert "not a valid ONNX model" in result.stderr and "Traceback" not in result.stderr


def test_status_explains_what_would_rerun(project):
    def status(*overrides):
        from onebuild.engine.status import status as compute

        plan = load_recipe(project / "r.toml", list(overrides))
        return {r.step: (r.status, r.reasons) for r in compute([plan])}

    assert status()["import"] == ("run", ["never built"])
    run(project)
    assert {s for s, _ in status().values()} == {"up-to-date"}
    changed = status("optimize.preset=O0")
    assert changed["import"][0] == "up-to-date"
    assert changed["optimize"] == ("run", ["option(s) changed: preset"])
    assert changed["pack"][0] == "pending" and "optimize" in changed["pack"][1][0]
    run(project, "optimize.preset=O0")
    back = status()  # back to O1: the step cache has both; pack is judged on the restored copy
    assert back["optimize"][0] == "restored" and back["pack"][0] == "restored"
    assert run(project) == {"import": "up-to-date", "optimize": "restored", "pack": "restored"}


def test_clean_then_rebuild_restores(project):
    run(project)
    cli = [sys.executable, "-m", "onebuild.cli", "clean", str(project / "r.toml")]
    assert subprocess.run(cli, capture_output=True).returncode == 0
    assert not (project / "out/m.nnpkg").exists()
    assert not (project / "build/r/optimize.obir").exists()
    assert set(run(project).values()) == {"restored"}


def test_a_package_another_recipe_replaced_is_made_again(project, caplog):
    """Two recipes writing one package path: each build makes it for its own recipe (with a
    warning), and status names the other recipe as the one reason."""
    from onebuild.engine.status import status

    (project / "s.toml").write_text(RECIPE.replace('preset = "O1"', 'preset = "O0"'))
    plans = {name: load_recipe(project / name) for name in ("r.toml", "s.toml")}
    made = {}
    for name in ("r.toml", "s.toml", "r.toml"):
        results = build([plans[name]], progress=lambda message: None)
        package = project / "out/m.nnpkg"
        made[name] = [p.read_bytes() for p in sorted(package.rglob("*")) if p.is_file()]
        assert json.loads((project / "out/m.nnpkg.log").read_text())["recipe"] == str(
            project / name
        )
        assert {r.step: r.status for r in results}["pack"] in ("run", "restored")
    assert made["r.toml"] != made["s.toml"]  # the last build is r's again, not s's left over
    assert "s.toml made" in caplog.text or "r.toml made" in caplog.text
    build([plans["s.toml"]], progress=lambda message: None)
    reasons = {r.step: r.reasons for r in status([plans["r.toml"]])}["pack"]
    assert reasons == [f"another recipe's step made its outputs since ({project / 's.toml'})"]


def test_a_build_of_several_recipes_keeps_built_steps_up_to_date(tmp_path):
    """doit's state of a multi-recipe build lives in the first recipe's folder; the others'
    steps are judged by their logs (same cache key, intact outputs): nothing runs or restores."""
    plans = []
    for name in ("a", "b"):
        folder = tmp_path / name
        folder.mkdir()
        shutil.copy(MODEL, folder / "model.onnx")
        (folder / "r.toml").write_text(RECIPE)
        plans.append(load_recipe(folder / "r.toml"))
        build([plans[-1]], progress=lambda message: None)
    results = build(plans, progress=lambda message: None)
    assert {r.status for r in results} == {"up-to-date"}, [(r.recipe, r.status) for r in results]


def test_a_recipe_named_twice_builds_once(project):
    """`onebuild build r.toml ./r.toml`: one recipe, once (it failed as two recipes writing the
    same outputs)."""
    recipe = project / "r.toml"
    same = project / "." / "r.toml"
    cli = [sys.executable, "-m", "onebuild.cli", "build", str(recipe), str(same), "--json"]
    result = subprocess.run(cli, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert [s["step"] for s in json.loads(result.stdout)["steps"]] == ["import", "optimize", "pack"]
