"""The session's workspace on real storage: opening writes nothing for an unchanged model (a
compiled workspace runs read-only), a full disk is not a decision, a corrupted record is
dropped and refilled, and one process at a time holds a workspace."""

import errno
import logging
import os
import shutil
import stat
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from digits_session import DIGITS, RECORDS, SHAPES, digits_data, digits_session

from onebuild import Session
from onebuild.errors import UserError
from onebuild.graph_ir.serde import save_ir
from onebuild.graph_ir.serde.irfile import ir_digest, ir_file_digest
from onebuild.npz import read_npz


@pytest.fixture(scope="module")
def data():
    return digits_data("calib"), digits_data("test")


def files(folder: Path) -> dict[str, tuple[int, int, int]]:
    """Every file and folder of `folder`: inode, modification time (ns) and size."""
    paths = [folder, *folder.rglob("*")]
    return {str(p.relative_to(folder)): (p.stat().st_ino, p.stat().st_mtime_ns,
                                        p.stat().st_size) for p in paths}  # fmt: skip


@contextmanager
def read_only(folder: Path, monkeypatch):
    """`chmod -R a-w folder`; as root (whom modes do not stop) every write into it is also
    refused with EROFS, as on a read-only mount."""
    paths = [folder, *folder.rglob("*")]
    modes = {p: p.stat().st_mode for p in paths}
    for p in paths:
        p.chmod(stat.S_IMODE(modes[p]) & ~0o222)
    try:
        with monkeypatch.context() as patch:
            if os.geteuid() == 0:
                refuse_writes(folder, patch)
            yield
    finally:
        for p in paths:
            p.chmod(stat.S_IMODE(modes[p]))


def refuse_writes(folder: Path, patch) -> None:
    inside = str(folder.resolve())

    def ours(path) -> bool:
        return isinstance(path, (str, os.PathLike)) and os.path.abspath(path).startswith(inside)

    def refuse(name, *args):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(args[0]))

    writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC
    real_open, real_access = os.open, os.access

    def fake_open(path, flags, *args, **kwargs):
        if ours(path) and flags & writes:
            refuse("open", path)
        return real_open(path, flags, *args, **kwargs)

    def fake_access(path, mode, *args, **kwargs):
        return False if ours(path) and mode & os.W_OK else real_access(path, mode, *args, **kwargs)

    patch.setattr(os, "open", fake_open)
    patch.setattr(os, "access", fake_access)
    for name in ("replace", "rename", "unlink", "mkdir", "rmdir"):
        real = getattr(os, name)

        def fake(path, *args, _real=real, _name=name, **kwargs):
            if ours(path):
                refuse(_name, path)
            return _real(path, *args, **kwargs)

        patch.setattr(os, name, fake)


@contextmanager
def full_disk(monkeypatch, where: str):
    """Writes of files whose temporary's name holds `where` fail with ENOSPC (at fsync, as
    on a full disk with delayed allocation)."""
    real = os.fsync

    def fsync(fd):
        if where in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd)

    with monkeypatch.context() as patch:
        patch.setattr(os, "fsync", fsync)
        yield


def test_the_digest_of_a_model_is_the_one_its_file_carries(tmp_path):
    session = digits_session(tmp_path / "ws")
    path = tmp_path / "m.obir"
    assert ir_digest(session._float) == save_ir(session._float, path) == ir_file_digest(path)
    path.write_bytes(path.read_bytes()[:-1] + b"\0")  # a corrupt trailer is not a digest
    assert ir_file_digest(path) is None


def test_opening_writes_nothing_and_a_compiled_workspace_runs_read_only(
    tmp_path, data, monkeypatch, caplog
):
    calib, test = data
    ws = tmp_path / "ws"
    session = digits_session(ws)
    for x in calib[:RECORDS]:
        session.run_with_auto_compilation({"input": x})
    assert session.state == "COMPILED"
    expected = [session.run({"input": x})["logits"] for x in test[:8]]
    del session
    before = files(ws)
    reopened = digits_session(ws)  # the old code rewrote model.obir here: new inode and mtime
    assert reopened.state == "COMPILED" and files(ws) == before
    del reopened
    with read_only(ws, monkeypatch):
        session = digits_session(ws)
        assert session.state == "COMPILED"
        for x, want in zip(test[:8], expected):
            got = session.run_with_auto_compilation({"input": x})["logits"]
            np.testing.assert_array_equal(got, want)
        session.set_quantization_type("I16_SYM")  # a change cannot be decided read-only
        session.run_with_auto_compilation({"input": test[0]})
        assert session.state == "COMPILED"
    assert files(ws) == before
    # a float session on a read-only workspace runs its float model and records nothing
    fresh = tmp_path / "fresh"
    digits_session(fresh)
    with read_only(fresh, monkeypatch), caplog.at_level(logging.WARNING, "onebuild"):
        session = digits_session(fresh)
        float_out = session.run_with_auto_compilation({"input": test[0]})["logits"]
        assert session.state == "INITIAL" and session.minmax_records == 0
    assert "read-only workspace" in caplog.text
    np.testing.assert_array_equal(
        float_out, session._float_runner.run({"input": test[0]})["logits"]
    )


@pytest.mark.parametrize(
    ("file", "stays"), [("model.tvn", "QUANTIZED"), ("quantized.obir", "INITIAL")]
)
def test_a_full_disk_is_not_a_decision(tmp_path, data, monkeypatch, caplog, file, stays):
    calib, test = data
    ws = tmp_path / "ws"
    session = digits_session(ws)
    for x in calib[: RECORDS - 1]:
        session.run_with_auto_compilation({"input": x})
    want = session._float_runner.run({"input": calib[RECORDS - 1]})["logits"]
    with full_disk(monkeypatch, f".{file}."), caplog.at_level(logging.WARNING, "onebuild"):
        # the old code recorded "codegen failed ... No space left on device" as the decision,
        # or (quantizing) raised the OSError and the app lost this run's result
        got = session.run_with_auto_compilation({"input": calib[RECORDS - 1]})["logits"]
        np.testing.assert_array_equal(got, want)  # the run that recorded answers as float
        assert session.state == stays and session.reason is None
        assert not (ws / file).exists()
    warnings = [r.getMessage() for r in caplog.records if "No space left" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith(str(ws / file)), warnings
    session.run_with_auto_compilation({"input": test[0]})  # this launch stays where it is
    assert session.state == stays
    del session
    relaunched = digits_session(ws)  # space freed: the next launch decides again
    relaunched.run_with_auto_compilation({"input": test[0]})
    assert relaunched.state == "COMPILED" and relaunched.reason is None


def test_a_run_keeps_its_result_when_recording_fails(tmp_path, data, monkeypatch, caplog):
    calib, _ = data
    ws = tmp_path / "ws"
    session = digits_session(ws)
    for x in calib[:3]:
        session.run_with_auto_compilation({"input": x})
    want = session._float_runner.run({"input": calib[3]})["logits"]
    with full_disk(monkeypatch, ".minmax.npz."), caplog.at_level(logging.WARNING, "onebuild"):
        got = session.run_with_auto_compilation({"input": calib[3]})["logits"]  # old: OSError
        np.testing.assert_array_equal(got, want)
        assert session.minmax_records == 3
    warnings = [r.getMessage() for r in caplog.records if "No space left" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith(str(ws / "minmax.npz")), warnings
    for x in calib[4 : 4 + RECORDS]:  # recording paused for minmax_records runs
        session.run_with_auto_compilation({"input": x})
    assert session.minmax_records == 3 and session.state == "INITIAL"
    session.run_with_auto_compilation({"input": calib[3]})  # then it tries again
    assert session.minmax_records == 4
    assert sorted(p.name for p in (ws / "records").iterdir())[-1] == "000003.npz"
    session.close()
    relaunched = digits_session(ws)
    assert relaunched.minmax_records == 4
    for x in calib[4:RECORDS]:
        relaunched.run_with_auto_compilation({"input": x})
    assert relaunched.state == "COMPILED"
    # as one uninterrupted recording of the same inputs
    whole = digits_session(tmp_path / "whole")
    for x in calib[:RECORDS]:
        whole.run_with_auto_compilation({"input": x})
    for name in ("minmax.npz", "quantized.obir", "model.tvn"):
        assert (ws / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name


def test_a_corrupted_record_is_dropped_and_refilled(tmp_path, data, caplog):
    calib, _ = data
    ws = tmp_path / "ws"
    session = digits_session(ws)
    for x in calib[: RECORDS - 1]:
        session.run_with_auto_compilation({"input": x})
    (ws / "records" / "000001.npz").write_bytes(b"x\n")
    with caplog.at_level(logging.WARNING, "onebuild"):
        session.run_with_auto_compilation({"input": calib[RECORDS - 1]})  # old: FormatError
    assert session.state == "INITIAL" and not (ws / "records" / "000001.npz").exists()
    assert caplog.text.count("000001.npz") == 1
    session.run_with_auto_compilation({"input": calib[RECORDS]})  # refills it, then decides
    np.testing.assert_array_equal(read_npz(ws / "records" / "000001.npz")["input"], calib[RECORDS])
    assert session.state == "COMPILED" and session.minmax_records == RECORDS + 1


def test_a_folder_in_place_of_a_record_is_left_and_not_used(tmp_path, data, caplog):
    """Not a file of onebuild's, so not removed; the session neither fails ("no such file")
    nor waits for it: the gate does without it."""
    calib, _ = data
    ws = tmp_path / "ws"
    session = digits_session(ws)
    for x in calib[: RECORDS - 1]:
        session.run_with_auto_compilation({"input": x})
    (ws / "records" / "000001.npz").unlink()
    (ws / "records" / "000001.npz").mkdir()
    (ws / "records" / "000001.npz" / "mine.txt").write_text("keep")
    with caplog.at_level(logging.WARNING, "onebuild"):
        session.run_with_auto_compilation({"input": calib[RECORDS - 1]})
    assert session.state == "COMPILED", session.reason
    assert "000001.npz: is not a regular file" in caplog.text and "left in place" in caplog.text
    assert (ws / "records" / "000001.npz" / "mine.txt").read_text() == "keep"
    assert session.gates["quantized"]["samples"] == RECORDS - 1


HOLDER = """
import sys
from onebuild import Session
from onebuild.npz import read_npz

session = Session(sys.argv[1], workspace=sys.argv[2], input_shapes={"input": [1, 1, 8, 8]})
session.set_odc_param_minmax_records_count(12)
for x in read_npz(sys.argv[3])["input"][:3]:
    session.run_with_auto_compilation({"input": x})
print(session.minmax_records, flush=True)
sys.stdin.readline()  # holds the workspace until told to go
"""


def test_one_process_at_a_time(tmp_path, data):
    calib, _ = data
    ws = tmp_path / "ws"
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, str(script), str(DIGITS / "digits.onnx"), str(ws)]
    holder = subprocess.Popen(
        [*argv, str(DIGITS / "data" / "calib.npz")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert holder.stdout.readline().strip() == "3"
        with pytest.raises(UserError, match="another process is using this session workspace"):
            digits_session(ws)
        with pytest.raises(UserError, match=str(ws)):
            digits_session(ws)
    finally:
        holder.communicate("go\n", timeout=60)
    session = digits_session(ws)  # the holder is gone: its runs are all there
    assert session.minmax_records == 3
    session.run_with_auto_compilation({"input": calib[3]})
    assert session.minmax_records == 4


def test_a_folder_in_place_of_the_state_is_one_line_naming_it(tmp_path):
    workspace = tmp_path / "ws"
    digits_session(workspace).close()
    (workspace / "state.json").unlink(missing_ok=True)
    (workspace / "state.json").mkdir()
    with pytest.raises(UserError, match="state.json: cannot read the session state"):
        digits_session(workspace)
    assert (workspace / "state.json").is_dir()


def test_a_file_in_place_of_the_records_folder_is_named(tmp_path):
    workspace = tmp_path / "ws"
    digits_session(workspace).close()
    shutil.rmtree(workspace / "records")
    (workspace / "records").write_text("mine")
    with pytest.raises(UserError, match="records: is not a folder, so the session cannot keep"):
        digits_session(workspace)
    assert (workspace / "records").read_text() == "mine"


@pytest.mark.parametrize("kind", ["folder", "fifo", "loop"])
def test_something_else_in_place_of_the_ranges_is_one_line_naming_it(tmp_path, kind):
    """A session that cannot write minmax.npz would record forever and never compile."""
    workspace = tmp_path / "ws"
    digits_session(workspace).close()
    minmax = workspace / "minmax.npz"
    minmax.unlink(missing_ok=True)
    {"folder": minmax.mkdir, "fifo": lambda: os.mkfifo(minmax)}.get(
        kind, lambda: minmax.symlink_to(minmax)
    )()
    with pytest.raises(UserError, match="minmax.npz: is not a file, so the session cannot"):
        digits_session(workspace)
    assert minmax.is_symlink() or minmax.exists()


@pytest.mark.parametrize("content", [b"", b"garbage, not an IR file"])
def test_a_corrupted_model_file_in_the_workspace_is_rewritten(tmp_path, data, content):
    """The workspace's model.obir is the session's own: emptied or overwritten, it is written
    again when the session opens (save_ir refuses to replace a file that is not an IR file)."""
    workspace = tmp_path / "ws"
    digits_session(workspace).close()
    (workspace / "model.obir").write_bytes(content)
    session = digits_session(workspace)
    session.run({"input": data[1][0]})
    assert ir_file_digest(workspace / "model.obir") is not None


def _opens(workspace) -> str:
    try:
        digits_session(workspace).close()
    except UserError as error:
        return str(error)
    return "opened"


def test_a_forked_child_neither_holds_nor_shares_its_parents_workspace(tmp_path):
    """A fork copies the parent's lock: the child drops its copy, so the parent's close
    releases the workspace while children live, and a child opening it is refused."""
    import multiprocessing

    workspace = tmp_path / "ws"
    session = digits_session(workspace)
    with multiprocessing.get_context("fork").Pool(1) as pool:
        assert "another process" in pool.apply(_opens, (workspace,))
        session.close()
        assert _opens(workspace) == "opened"  # the pool's worker still lives


def test_sessions_opened_from_threads_share_the_process_lock(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    workspace = tmp_path / "ws"
    digits_session(workspace).close()
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: _opens(workspace), range(32)))
    assert results == ["opened"] * 32


def onnxruntime_logits(model: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return session.run(["logits"], {"input": x})[0]


def test_a_float_model_in_a_read_only_folder_runs_without_a_workspace(
    tmp_path, data, monkeypatch, caplog
):
    """nnfw's flow, load and run, from read-only storage: the old code refused to open
    (the default workspace PATH.odc could not be created) and had no way to turn it off."""
    _, test = data
    app = tmp_path / "app"
    app.mkdir()
    model = app / "digits.onnx"
    model.write_bytes((DIGITS / "digits.onnx").read_bytes())
    with read_only(app, monkeypatch), caplog.at_level(logging.WARNING, "onebuild"):
        session = Session(model, input_shapes=SHAPES)
        for x in test[:4]:
            got = session.run_with_auto_compilation({"input": x})["logits"]
            np.testing.assert_allclose(got, onnxruntime_logits(model, x), rtol=1e-5, atol=1e-5)
        assert session.state == "INITIAL" and session.workspace is None
    assert [p.name for p in app.iterdir()] == ["digits.onnx"]
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "\n" not in warnings[0], warnings
    assert warnings[0].startswith(str(app / "digits.onnx.odc")) and "workspace=False" in warnings[0]
    with pytest.raises(UserError, match=r"needs a session workspace .*workspace=DIR"):
        session.set_execute_config("DUMP_MINMAX")


def test_workspace_false_runs_the_model_and_refuses_to_record_or_compile(tmp_path, data, caplog):
    _, test = data
    model = tmp_path / "digits.onnx"
    model.write_bytes((DIGITS / "digits.onnx").read_bytes())
    with caplog.at_level(logging.WARNING, "onebuild"):
        session = Session(model, workspace=False, input_shapes=SHAPES)
        got = session.run({"input": test[0]})["logits"]
        session.run_with_auto_compilation({"input": test[1]})  # runs, records nothing
    np.testing.assert_allclose(got, onnxruntime_logits(model, test[0]), rtol=1e-5, atol=1e-5)
    assert session.minmax_records == 0 and not caplog.records
    assert sorted(p.name for p in tmp_path.iterdir()) == ["digits.onnx"]  # old: digits.onnx.odc
    for call in (lambda: session.set_execute_config("DUMP_MINMAX"), session.quantize,
                 session.compile_now):  # fmt: skip
        with pytest.raises(UserError, match=r"\(workspace=False\): give Session\(workspace=DIR\)"):
            call()


def test_the_command_line_names_the_workspace_option_when_the_folder_is_read_only(
    tmp_path, data, monkeypatch, capsys
):
    from onebuild.cli import main
    from onebuild.npz import write_npz

    app = tmp_path / "app"
    app.mkdir()
    model = app / "digits.onnx"
    model.write_bytes((DIGITS / "digits.onnx").read_bytes())
    write_npz(tmp_path / "in.npz", {"input": data[1][:2]})
    run = ["run", str(model), "-i", str(tmp_path / "in.npz"), "-o", str(tmp_path / "o.npz")]
    with read_only(app, monkeypatch):
        assert main([*run, "--input-shape", "input=1,1,8,8", "--auto-compile"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and str(app / "digits.onnx.odc") in error
    assert "--workspace DIR" in error
    workspace = tmp_path / "ws"
    assert main([*run, "--input-shape", "input=1,1,8,8", "--auto-compile", "--workspace",
                 str(workspace)]) == 0  # fmt: skip
    assert (workspace / "minmax.npz").is_file()
