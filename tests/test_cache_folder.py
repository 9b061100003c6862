"""A step cache folder is onebuild's only when marked (or holding nothing but its entries):
`cache gc` and builds never delete or write into a user's folder."""

import os
import time
from pathlib import Path

from test_data_loss import assert_refused, cli, project

from onebuild.engine import cache_folder
from onebuild.engine.cache_gc import collect
from onebuild.engine.step_cache import StepCache

KEYS = ["ab" + "1" * 62, "ab" + "2" * 62, "cd" + "3" * 62]


def _age(path: Path, seconds: float = 2 * 86400) -> None:
    old = time.time() - seconds
    os.utime(path, (old, old))


def _foreign(folder: Path) -> None:
    """The reviewer's layout: a git checkout and a project whose file is named entry.json."""
    (folder / "go/.git/objects").mkdir(parents=True)
    (folder / "go/.git/objects/blob").write_text("code")
    (folder / "js/myapp").mkdir(parents=True)
    (folder / "js/myapp/entry.json").write_text('{"name": "myapp"}')
    (folder / "js/myapp/index.js").write_text("src")
    _age(folder / "go/.git")


def _cache(folder: Path, tmp_path: Path) -> StepCache:
    cache = StepCache(folder)
    source = tmp_path / "output.bin"
    source.write_bytes(b"x" * 1000)
    for key in KEYS:
        cache.store(key, [source])
    return cache


def test_gc_refuses_a_folder_that_is_not_a_cache_and_deletes_nothing(tmp_path):
    folder = tmp_path / "X"
    _foreign(folder)
    for size in ("10G", "0"):
        assert_refused(cli("cache", "gc", str(folder), "--max-size", size, cwd=tmp_path), "X")
    assert (folder / "go/.git/objects/blob").read_text() == "code"
    assert (folder / "js/myapp/index.js").read_text() == "src"
    assert not (folder / cache_folder.MARK).exists()


def test_gc_in_a_marked_cache_removes_only_onebuilds_entries_and_temporaries(tmp_path):
    folder = tmp_path / "cache"
    _cache(folder, tmp_path)
    assert (folder / cache_folder.MARK).is_file()  # the first store marks the folder
    (folder / "ab/.git").mkdir()  # foreign, hidden and old, inside a shard folder
    _age(folder / "ab/.git")
    (folder / "ab/myapp").mkdir()
    (folder / "ab/myapp/entry.json").write_text('{"outputs": [], "digests": []}')
    killed = folder / "cd/.cd333333.k2j_x9"  # a killed build's staging folder
    killed.mkdir()
    _age(killed)
    result = cli("cache", "gc", str(folder), "--max-size", "0", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("3 entr(ies) removed")
    assert (folder / "ab/.git").is_dir() and (folder / "ab/myapp/entry.json").is_file()
    assert not killed.exists()
    assert not any((folder / key[:2] / key).exists() for key in KEYS)


def test_an_unmarked_cache_of_onebuilds_entries_only_is_adopted(tmp_path):
    folder = tmp_path / "cache"
    _cache(folder, tmp_path)
    (folder / cache_folder.MARK).unlink()  # a cache made before marks
    result = cli("cache", "gc", str(folder), "--max-size", "0", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("3 entr(ies) removed")
    assert cache_folder.is_marked(folder)


def test_build_refuses_a_user_folder_as_its_cache_and_marks_a_new_one(tmp_path):
    recipe = project(tmp_path / "p", "out/m.nnpkg")
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("keep me")
    result = cli("build", str(recipe), "--set", f"build.cache={home}", cwd=recipe.parent)
    assert_refused(result, "build.cache", "not onebuild's")
    assert [p.name for p in home.iterdir()] == ["notes.txt"]
    fresh = tmp_path / "fresh"
    result = cli("build", str(recipe), "--set", f"build.cache={fresh}", cwd=recipe.parent)
    assert result.returncode == 0, result.stderr
    assert cache_folder.is_marked(fresh) and list(fresh.glob("??/*/entry.json"))


def test_gc_removes_an_entry_beside_what_a_killed_gc_left(tmp_path):
    """A gc killed between renaming an entry aside and deleting it leaves `.drop.<key8>`; the
    next gc still removes that entry (the old gc renamed onto the leftover, failed silently and
    deleted the leftover instead); a build dropping a damaged entry shares the code."""
    folder = tmp_path / "cache"
    cache = _cache(folder, tmp_path)
    for key in KEYS[:2]:
        leftover = folder / key[:2] / f".drop.{key[:8]}"
        leftover.mkdir()
        (leftover / "0").write_bytes(b"what the killed gc was removing")
    cache.drop(KEYS[1])
    assert not (folder / KEYS[1][:2] / KEYS[1]).exists()
    result = collect(str(folder), 0)
    assert (result.removed, result.kept) == (2, 0)
    assert not any((folder / key[:2] / key).exists() for key in KEYS)
    assert sorted(p.name for p in (folder / "ab").iterdir()) == [
        f".drop.{KEYS[0][:8]}",
        f".drop.{KEYS[1][:8]}",
    ]  # the leftovers: swept when stale (an hour), never in place of an entry
