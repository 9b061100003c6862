"""The Python API replaces only what onebuild wrote and creates no folders (as the CLI does):
`write_package`, `Partitioned.save` and `save_ir` refuse anything else with one line naming
the path, and leave it untouched. On the trained digits example."""

import copy
import errno
import hashlib
import os
import shutil
from pathlib import Path

import pytest

from onebuild import compile as api
from onebuild.cli import main
from onebuild.errors import UserError
from onebuild.graph_ir import serde
from onebuild.graph_ir.serde import load_ir, load_model, save_ir
from onebuild.npz import read_npz
from onebuild.packing import write_package
from onebuild.targets import binary_target

EXAMPLE = Path(__file__).parent.parent / "examples" / "digits"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The digits model: float (optimized), quantized on its calibration set, partitioned."""
    folder = tmp_path_factory.mktemp("digits")
    model = api.optimize(load_model(EXAMPLE / "digits.onnx", {"input": [1, 1, 8, 8]}))
    calib = read_npz(EXAMPLE / "data" / "calib.npz")
    stats = api.calibrate(model.main, calib)
    float_graph = copy.deepcopy(model.main)
    quantized = api.quantize(model, api.QuantizeOptions(), stats)
    save_ir(quantized, folder / "digits.q.obir")
    parts = api.partition(quantized.main, "digits")
    return folder, quantized, parts, float_graph


def one_line(error: pytest.ExceptionInfo, *fragments: str) -> None:
    text = str(error.value)
    assert "\n" not in text and isinstance(error.value, UserError), text
    for fragment in fragments:
        assert fragment in text, text


def test_write_package_refuses_a_user_folder_and_a_file(built, tmp_path):
    model = built[0] / "digits.q.obir"
    mine = tmp_path / "mydata"
    mine.mkdir()
    (mine / "thesis.txt").write_text("precious")
    with pytest.raises(UserError) as error:
        write_package(mine, [model])
    one_line(error, str(mine), "not replaced")
    assert (mine / "thesis.txt").read_text() == "precious"
    victim = tmp_path / "victim.onnx"
    shutil.copy(EXAMPLE / "digits.onnx", victim)
    with pytest.raises(UserError) as error:
        write_package(victim, [model])
    one_line(error, str(victim))
    assert victim.read_bytes() == (EXAMPLE / "digits.onnx").read_bytes()


def test_write_package_replaces_its_own_package_only(built, tmp_path):
    model = built[0] / "digits.q.obir"
    package = tmp_path / "digits"
    write_package(package, [model])
    write_package(package, [model])  # its own package: replaced
    assert (package / "metadata" / "MANIFEST").is_file()
    (package / "notes.txt").write_text("the user's")  # now it holds a file onebuild did not write
    with pytest.raises(UserError) as error:
        write_package(package, [model])
    one_line(error, str(package))
    assert (package / "notes.txt").read_text() == "the user's"


def test_write_package_creates_no_folders_and_keeps_foreign_archives(built, tmp_path):
    model = built[0] / "digits.q.obir"
    with pytest.raises(UserError) as error:
        write_package(tmp_path / "nope" / "pkg", [model])
    one_line(error, "nope", "creates no folders")
    assert not (tmp_path / "nope").exists()
    archive = tmp_path / "pkg.zip"
    archive.write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip the user made
    with pytest.raises(UserError) as error:
        write_package(tmp_path / "pkg", [model], archive=archive)
    one_line(error, str(archive))
    assert archive.read_bytes() == b"PK\x05\x06" + bytes(18) and not (tmp_path / "pkg").exists()
    write_package(tmp_path / "pkg2", [model], archive=tmp_path / "pkg2.zip")
    write_package(tmp_path / "pkg2", [model], archive=tmp_path / "pkg2.zip")  # its own zip


def test_write_package_needs_models_and_a_connection_for_several(built, tmp_path):
    with pytest.raises(UserError) as error:
        write_package(tmp_path / "pkg", [])
    one_line(error, "at least one model")
    model = built[0] / "digits.q.obir"
    with pytest.raises(UserError) as error:
        write_package(tmp_path / "pkg", [model, model])
    one_line(error, "connection")


def test_partition_save_replaces_only_a_partition_folder(built, tmp_path):
    parts = built[2]
    mine = tmp_path / "myparts"
    mine.mkdir()
    (mine / "thesis.txt").write_text("precious")
    with pytest.raises(UserError) as error:
        parts.save(mine)
    one_line(error, str(mine), "partition folder")
    assert (mine / "thesis.txt").read_text() == "precious"
    with pytest.raises(UserError) as error:
        parts.save(tmp_path / "nope" / "parts")
    one_line(error, "creates no folders")
    assert not (tmp_path / "nope").exists()
    own = tmp_path / "parts"
    connection = parts.save(own)
    assert parts.save(own) == connection and connection.is_file()  # its own folder: replaced
    write_package(str(tmp_path / "pkg"), [str(own / f) for f in parts.files], str(connection))
    assert (tmp_path / "pkg" / "metadata" / "MANIFEST").is_file()  # str paths, as load_model


def test_save_ir_replaces_only_ir_files_and_creates_no_folders(built, tmp_path):
    quantized = built[1]
    onnx_file = tmp_path / "model.onnx"
    shutil.copy(EXAMPLE / "digits.onnx", onnx_file)
    with pytest.raises(UserError) as error:
        save_ir(quantized, onnx_file)
    one_line(error, str(onnx_file), "not an IR file")
    assert onnx_file.read_bytes() == (EXAMPLE / "digits.onnx").read_bytes()
    with pytest.raises(UserError) as error:
        save_ir(quantized, tmp_path / "nope" / "x.obir")
    one_line(error, "creates no folders")
    assert not (tmp_path / "nope").exists()
    path = tmp_path / "q.obir"
    save_ir(quantized, path)
    digest = save_ir(quantized, path)  # an IR file: replaced
    assert load_ir(path).main.name == quantized.main.name and len(digest) == 64


def test_compile_file_takes_string_paths(built, tmp_path):
    output = tmp_path / "digits.tvn"
    api.compile_file(str(built[0] / "digits.q.obir"), str(output))
    assert binary_target(output) is not None


@pytest.mark.parametrize("change", ["replaced", "rewritten"])
def test_compile_file_refuses_a_source_changed_while_it_was_compiled(
    built, tmp_path, monkeypatch, change
):
    """The binary names the digest of the file it was compiled from: a file replaced (saved
    by rename) or rewritten in place between the load and the digest is refused in one line,
    not compiled from one content and named by another's digest; unchanged, the digest is the
    file's SHA-256."""
    source, output = tmp_path / "m.obir", tmp_path / "m.tvn"
    shutil.copy(built[0] / "digits.q.obir", source)
    api.compile_file(source, output)
    meta = binary_target(output).load(output).describe()["meta"]
    assert meta["source_sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    load = serde.load_model

    def load_then_change(path, *args):
        model = load(path, *args)
        if change == "replaced":
            save_ir(built[1], tmp_path / "new.obir")
            os.replace(tmp_path / "new.obir", path)
        else:
            with open(path, "r+b") as handle:
                handle.seek(0, os.SEEK_END)
                handle.write(b"\0")
        return model

    monkeypatch.setattr(serde, "load_model", load_then_change)
    with pytest.raises(UserError) as error:
        api.compile_file(source, tmp_path / "changed.tvn")
    one_line(error, str(source), "changed while it was compiled")
    assert not (tmp_path / "changed.tvn").exists()


SHAPE = ["--input-shape", "input=1,1,8,8"]


@pytest.mark.parametrize(
    ("command", "name"),
    [
        (["import", str(EXAMPLE / "digits.onnx"), *SHAPE], "digits.obir"),
        (["export", str(EXAMPLE / "digits.onnx"), *SHAPE], "digits.circle"),
        (["run", str(EXAMPLE / "digits.onnx"), *SHAPE, "-i", str(EXAMPLE / "data" / "eval.npz")],
         "out.npz"),
    ],
)  # fmt: skip
def test_a_full_disk_on_the_cli_names_the_file_and_exits_2(
    tmp_path, monkeypatch, capsys, command, name
):
    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")  # as write/fsync report it

    monkeypatch.setattr("onebuild.fileio.os.fsync", full)
    output = tmp_path / name
    code = main([*command, "-o", str(output)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1, lines
    assert str(output) in lines[0] and "no space left" in lines[0], lines[0]
    assert list(tmp_path.iterdir()) == []  # nothing written, no temporary left


def test_a_full_disk_while_packing_names_the_package(built, tmp_path, monkeypatch):
    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("onebuild.fileio.os.fsync", full)
    package = tmp_path / "digits"
    with pytest.raises(OSError) as error:
        write_package(package, [built[0] / "digits.q.obir"])
    assert error.value.errno == errno.ENOSPC and error.value.filename == str(package)
    assert error.value.strerror == "cannot write it (No space left on device)"
    assert list(tmp_path.iterdir()) == []  # no temporary left behind


@pytest.mark.parametrize(
    ("code", "fragment"),
    [(errno.EROFS, "read-only file system"), (errno.EACCES, "Permission denied")],
)
def test_read_only_or_forbidden_storage_on_the_cli_is_one_line_exit_2(
    tmp_path, monkeypatch, capsys, code, fragment
):
    def refuse(*args, **kwargs):
        raise OSError(code, os.strerror(code))  # as mkstemp reports it, without a file name

    monkeypatch.setattr("onebuild.fileio.tempfile.mkstemp", refuse)
    output = tmp_path / "digits.obir"
    exit_code = main(["import", str(EXAMPLE / "digits.onnx"), *SHAPE, "-o", str(output)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_code == 2 and len(lines) == 1, lines
    assert str(output) in lines[0] and fragment in lines[0], lines[0]


def test_a_partition_folder_with_its_parts_compiled_in_place_is_replaced(built, tmp_path):
    """The Session and the README's script compile each NPU part beside it (`<part>.tvn`): the
    folder stays onebuild's, so the next save (a new decision, a second run) replaces it; a file
    that is no part's binary still makes it someone else's."""
    parts = built[2]
    own = tmp_path / "parts"
    parts.save(own)
    for file, backend in zip(parts.files, parts.backends):
        if backend != "cpu":
            api.compile_file(own / file, (own / file).with_suffix(".tvn"))
    assert any(p.suffix == ".tvn" for p in own.iterdir())
    parts.save(own)
    (own / "notes.tvn").write_text("mine")
    with pytest.raises(UserError) as error:
        parts.save(own)
    one_line(error, str(own), "partition folder")


@pytest.mark.parametrize("name", ["{part}.txt", "{part}.json", "mine.obir"])
def test_a_file_sharing_a_parts_stem_is_not_the_partitions(built, tmp_path, name):
    """Only `<part>.<binary suffix>` beside a part is onebuild's: a note named after a part
    (`digits.00001_trix.txt`), or an IR file the connection does not list, keep the folder the
    user's (they were swept away with it)."""
    parts = built[2]
    own = tmp_path / "parts"
    parts.save(own)
    note = own / name.format(part=Path(parts.files[0]).stem)
    if note.suffix == ".obir":
        save_ir(load_ir(own / parts.files[0]), note)
    else:
        note.write_text("my notes")
    kept = note.read_bytes()
    with pytest.raises(UserError) as error:
        parts.save(own)
    one_line(error, str(own), "partition folder")
    assert note.read_bytes() == kept
