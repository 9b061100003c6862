"""I/O failures during a build are one line naming the place: a full disk in a step or in doit's
task database (injected: a real full filesystem needs privileges CI may not have)."""

import errno
import shutil
import sqlite3
from pathlib import Path

import pytest
from doit.dependency import SqliteDB

from onebuild.engine.dag import build
from onebuild.errors import UserError
from onebuild.recipe import load_recipe
from onebuild.tasks import STEPS, Step

MODEL = Path(__file__).parent.parent / "examples" / "models" / "tiny_mobilenet.onnx"
RECIPE = '[import]\nsource = "m.onnx"\ninput_shapes = { x = [1, 3, 32, 32] }\n[optimize]\n'


@pytest.fixture
def plan(tmp_path):
    shutil.copy(MODEL, tmp_path / "m.onnx")
    (tmp_path / "r.toml").write_text(RECIPE)
    return load_recipe(tmp_path / "r.toml")


class _FullDisk(Step):
    def run(self, config, inputs, outputs):
        raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_in_a_step_is_one_line_naming_the_folder(plan, monkeypatch):
    monkeypatch.setitem(STEPS, "optimize", _FullDisk("optimize", STEPS["optimize"].module))
    results = {r.step: r for r in build([plan], progress=lambda message: None)}
    error = results["optimize"].error
    assert results["optimize"].status == "failed"
    assert error == f"{plan.build_dir}: no space left on its device; free space and build again"


def test_a_full_disk_under_the_task_database_is_one_line(plan, monkeypatch):
    def dump(self):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(SqliteDB, "dump", dump)
    with pytest.raises(UserError) as caught:
        build([plan], progress=lambda message: None)
    assert str(caught.value) == (
        f"{plan.build_dir}: no space left on its device; free space and build again"
    )
