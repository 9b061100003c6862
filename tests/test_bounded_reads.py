"""Files onebuild reads are regular files of bounded size: a FIFO, a device or a huge file in
place of a onecc configuration, a step log or a session's workspace file is one line (or, for
what onebuild made itself, treated as damaged), never a hang, an out-of-memory or a traceback."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from digits_session import digits_session
from test_data_loss import cli, project

from onebuild.errors import UserError
from onebuild.fileio import read_regular
from onebuild.runtime.workspace import sha256

TIMEOUT = 120


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "onebuild.cli", *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT)


def _one_line(result: subprocess.CompletedProcess, code: int = 2) -> str:
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("onebuild: error: "), result.stderr
    return lines[0]


def test_read_regular_refuses_fifos_devices_folders_and_large_files(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "big").write_bytes(b"x" * 101)
    (tmp_path / "ok").write_bytes(b"x" * 100)
    for path, words in [
        (tmp_path / "fifo", "is a FIFO, device or socket"),
        (Path("/dev/zero"), "is a FIFO, device or socket"),
        (tmp_path, "is a folder"),
        (tmp_path / "big", "is 101 bytes, more than the 100"),
    ]:
        with pytest.raises(UserError, match=words):
            read_regular(path, 100)
    assert read_regular(tmp_path / "ok", 100) == b"x" * 100
    with pytest.raises(FileNotFoundError):
        read_regular(tmp_path / "missing", 100)


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_convert_cfg_of_a_fifo_or_a_device_is_one_line(tmp_path, kind):
    cfg = tmp_path / "m.cfg"
    os.mkfifo(cfg) if kind == "fifo" else cfg.symlink_to("/dev/zero")
    line = _one_line(_run("convert-cfg", str(cfg), cwd=tmp_path))
    assert f"{cfg}: " in line and "not a regular file" in line


@pytest.mark.parametrize("damage", ["fifo", "list", "deep", "zero"])
def test_a_damaged_package_log_is_never_a_hang_or_a_traceback(tmp_path, damage):
    folder = tmp_path / "p"
    assert cli("build", str(project(folder, "out/m.nnpkg")), cwd=folder).returncode == 0
    log = folder / "out/m.nnpkg.log"
    log.unlink()
    if damage == "fifo":
        os.mkfifo(log)
    elif damage == "zero":
        log.symlink_to("/dev/zero")
    else:
        log.write_text("[1]" if damage == "list" else "[" * 100000 + "]" * 100000)
    status = _run("status", "r.toml", "--json", cwd=folder)
    assert status.returncode in (0, 1) and "Traceback" not in status.stderr, status.stderr
    [pack] = [s for s in json.loads(status.stdout)["steps"] if s["step"] == "pack"]
    assert pack["reasons"] == ["its build log is unreadable"]
    # The log no longer names the package: neither a build nor clean may replace or remove it.
    assert "did not make" in _one_line(_run("build", "r.toml", cwd=folder))
    clean = _run("clean", "r.toml", cwd=folder)
    assert clean.returncode in (0, 2) and "Traceback" not in clean.stderr, clean.stderr
    assert (folder / "out/m.nnpkg/metadata/MANIFEST").is_file()


@pytest.mark.parametrize("kind", ["fifo", "zero", "loop"])
def test_workspace_files_that_are_not_regular(tmp_path, kind):
    workspace = tmp_path / "ws"
    digits_session(workspace).close()

    def put(path: Path) -> None:
        path.unlink()
        if kind == "fifo":
            os.mkfifo(path)
        elif kind == "zero":
            path.symlink_to("/dev/zero")
        else:
            path.symlink_to(path)

    put(workspace / "model.obir")
    assert sha256(workspace / "model.obir") is None
    put(workspace / "state.json")
    with pytest.raises((UserError, OSError), match="state.json"):
        digits_session(workspace)


@pytest.mark.parametrize("kind", ["fifo", "zero", "folder"])
def test_an_input_that_exists_but_is_not_a_file_is_not_called_missing(tmp_path, kind):
    from onebuild.errors import FormatError
    from onebuild.npz import read_npz

    for name in ("m.onnx", "x.npz"):
        path = tmp_path / name
        {"fifo": lambda p: os.mkfifo(p), "folder": Path.mkdir}.get(
            kind, lambda p: p.symlink_to("/dev/zero")
        )(path)
    line = _one_line(_run("inspect", "m.onnx", cwd=tmp_path))
    folder = "m.onnx: not an nnpackage (no metadata/MANIFEST)"  # a folder may be a package
    assert (folder if kind == "folder" else "m.onnx: is not a regular file") in line
    with pytest.raises(FormatError, match="x.npz: is not a regular file"):
        read_npz(tmp_path / "x.npz")
