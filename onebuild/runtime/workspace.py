"""The on-device session's workspace: what was recorded and built, crash-consistent.

    state.json          the session state (written last, atomically, after every artifact)
    model.obir          the float model as prepared (imported, O1): the quantizer's input
    minmax.npz          recorded activation ranges, in the calibration statistics format
    records/NNNNNN.npz  the first recorded inputs (float, one sample each), for the gate
    quantized.obir      the quantized model (unless set_quantized_model_path chose another;
                        quantized.circle when the app gave a circle package)
    model.tvn           the compiled model (unless set_codegen_model_path chose another), or
    compiled.nnpkg/     when only parts of it run on the NPU: the build's partition, codegen and
    partition/          pack steps' package of .tvn and CPU parts, and the parts themselves

Every file is replaced atomically, so a killed process leaves old or new files, never torn
ones; stray temporaries (hidden files and folders named after these entries) and records
beyond the recorded count are swept when a session opens. A folder holding anything else is
not a workspace: the session refuses it rather than sweep or clear it (a workspace carries a
`.onebuild-workspace` mark from its creation), and it creates the workspace folder only inside
a folder that exists.
The state names artifacts with their SHA-256, so a file changed behind the session's back is
rebuilt instead of trusted. One process at a time: a `Workspace` holds an exclusive flock on the
mark (shared by the workspaces of one process) until `close()` or its collection.
"""

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np

from ..errors import FormatError, UserError
from ..fileio import atomic_write_bytes, file_digest, read_regular
from ..graph_ir.quant.calibrate import CalibrationStats
from ..graph_ir.serde.calibration_file import load_calibration, save_calibration
from ..npz import read_npz, write_npz

FORMAT = 1
MARK = ".onebuild-workspace"  # written first: what `_claim` accepts as a workspace
ENTRIES = ("state.json", "model.obir", "minmax.npz", "records", "quantized.obir",
           "quantized.circle", "model.tvn", "partition", "compiled.nnpkg")  # fmt: skip
RECORD_TEMPORARY = re.compile(r"\.\d{6}\.npz\.")
STATE_LIMIT = 16 << 20  # state.json: settings, artifact digests and gate results
log = logging.getLogger("onebuild")


def sha256(path: Path) -> str | None:
    """The SHA-256 of a file, or of a folder's file names and contents; None if missing."""
    if path.is_dir():
        digest = hashlib.sha256()
        for file in sorted(p for p in path.rglob("*") if p.is_file()):
            digest.update(f"{file.relative_to(path).as_posix()}\0".encode())
            digest.update(bytes.fromhex(sha256(file)))
        return digest.hexdigest()
    try:
        return file_digest(path)
    except (OSError, UserError):  # missing, or no file to trust (a FIFO, a symlink loop)
        return None


class Workspace:
    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        self.records_folder = self.folder / "records"
        try:
            _claim(self.folder)
            if not self.records_folder.is_dir():
                if self.records_folder.exists() or self.records_folder.is_symlink():
                    raise UserError(
                        f"{self.records_folder}: is not a folder, so the session cannot keep "
                        "its records there; move it away, or give the session another workspace"
                    )
                self.records_folder.mkdir()
        except OSError as error:
            what = "it is a file" if self.folder.is_file() else error.strerror
            raise UserError(
                f"{self.folder}: cannot be the session workspace ({what}); give the session a "
                "folder on writable storage (Session(workspace=DIR), run --workspace DIR), or "
                "none (Session(workspace=False): run without recording or compiling)"
            ) from None
        self.close = weakref.finalize(self, _unlock, _lock(self.folder))  # releases the lock
        self.state_file = self.folder / "state.json"
        self.model = self.folder / "model.obir"
        self.minmax = self.folder / "minmax.npz"
        self.quantized = self.folder / "quantized.obir"
        self.compiled = self.folder / "model.tvn"
        self.partition = self.folder / "partition"  # parts, when not all of it runs on the NPU
        self.package = self.folder / "compiled.nnpkg"  # their package
        strays = [p for p in self.folder.iterdir() if _temporary(p.name, ENTRIES)]
        strays += [p for p in self.records_folder.iterdir() if RECORD_TEMPORARY.match(p.name)]
        for stray in strays:  # temporaries of writes a kill interrupted
            if stray.is_dir():
                shutil.rmtree(stray, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):  # read-only: left for a writable launch
                    stray.unlink(missing_ok=True)

    def read_state(self) -> dict | None:
        """The saved state, or None when there is none (or it is not ours)."""
        try:
            state = json.loads(read_regular(self.state_file, STATE_LIMIT).decode("utf-8"))
        except FileNotFoundError:
            return None
        except (ValueError, UnicodeDecodeError, RecursionError):
            log.warning("%s: unreadable session state; starting over", self.state_file)
            return None
        except (OSError, UserError) as error:  # a folder, a FIFO in its place, no permission
            reason = error.strerror if isinstance(error, OSError) else str(error).split(": ")[-1]
            raise UserError(
                f"{self.state_file}: cannot read the session state ({reason}); move it away, "
                "or give the session another workspace"
            ) from None
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            log.warning(
                "%s: not a session state of format %d; starting over", self.state_file, FORMAT
            )
            return None
        wrong = _wrong_keys(state)
        if wrong:
            log.warning(
                "%s: %s of the wrong type (edited by hand?); starting over",
                self.state_file,
                ", ".join(wrong),
            )
            return None
        return state

    def write_state(self, state: dict) -> None:
        text = json.dumps({"format": FORMAT, **state}, indent=2, sort_keys=True) + "\n"
        with naming(self.state_file):
            atomic_write_bytes(self.state_file, text.encode())

    def read_minmax(self) -> CalibrationStats | None:
        """The recorded ranges; None without any. Something else in the file's place (a
        folder) is refused: it would be never replaced, so the session would never compile."""
        if not self.minmax.exists() and not self.minmax.is_symlink():
            return None
        if not self.minmax.is_file():
            raise UserError(
                f"{self.minmax}: is not a file, so the session cannot record its ranges there; "
                "move it away, or give the session another workspace"
            )
        try:
            return load_calibration(self.minmax)
        except FormatError as error:
            log.warning("%s; recording starts over", error)
            return None

    def write_minmax(self, stats: CalibrationStats) -> None:
        with naming(self.minmax):
            save_calibration(stats, self.minmax)

    def record_path(self, index: int) -> Path:
        return self.records_folder / f"{index:06d}.npz"

    def write_record(self, index: int, feeds: dict[str, np.ndarray]) -> None:
        with naming(self.record_path(index)):
            write_npz(self.record_path(index), feeds)

    def read_records(self, count: int) -> list[dict[str, np.ndarray]]:
        """Records 0 .. count-1 that are there; a corrupted one is warned about and dropped
        (as a corrupted minmax.npz is), and recording refills its place (`missing_records`)."""
        records = []
        for index in range(count):
            path = self.record_path(index)
            if not path.exists():
                continue
            try:
                records.append(read_npz(path))
            except FormatError as error:
                if not path.is_file():  # not onebuild's to remove: the gate does without it
                    log.warning("%s; left in place, the gate does without it", error)
                    continue
                log.warning("%s; dropped, recording refills it", error)
                with contextlib.suppress(OSError):
                    path.unlink()
        return records

    def blocked_records(self, count: int) -> list[int]:
        """The numbers below `count` whose place holds something not a file (a folder): not
        onebuild's to remove, so never refilled."""
        paths = [(index, self.record_path(index)) for index in range(count)]
        return [i for i, p in paths if (p.exists() or p.is_symlink()) and not p.is_file()]

    def missing_records(self, count: int) -> list[int]:
        """The numbers below `count` that have no record (dropped, or deleted by hand)."""
        return [index for index in range(count) if not self.record_path(index).exists()]

    def keep_records(self, count: int) -> None:
        """Delete records numbered `count` and above (written by a run whose ranges were not)."""
        for path in self.records_folder.glob("*.npz"):
            if not path.stem.isdigit() or int(path.stem) >= count:
                with contextlib.suppress(OSError):  # read-only: the next record replaces it
                    path.unlink(missing_ok=True)

    def forget(self) -> None:
        """Drop what was recorded and built (the model changed)."""
        self.keep_records(0)
        circle = self.quantized.with_suffix(".circle")
        for path in (self.minmax, self.quantized, circle, self.compiled, self.state_file):
            path.unlink(missing_ok=True)
        for folder in (self.partition, self.package):
            shutil.rmtree(folder, ignore_errors=True)


def creatable(folder: Path) -> bool:
    """Whether opening `folder` as a workspace is worth trying: it exists, its parent is
    missing (which `Workspace` reports), or its parent is writable by this process (a
    read-only mount refuses even root)."""
    return folder.exists() or not folder.parent.is_dir() or os.access(folder.parent, os.W_OK)


def _claim(folder: Path) -> None:
    """Create the workspace folder (in a folder that exists: onebuild creates no others) and
    mark it, or check that the existing one is a workspace: marked (`MARK`), empty, or (made
    before marks) holding a session state and nothing but a workspace's files. A folder of the
    user's is never swept or cleared, whatever names its files have."""
    if not folder.is_dir():
        if not folder.parent.is_dir():
            raise UserError(
                f"{folder}: cannot be the session workspace (folder {folder.parent} does not "
                "exist; onebuild creates no folders: create it or choose another workspace)"
            )
        folder.mkdir()
    elif (folder / MARK).is_file():
        return
    elif any(folder.iterdir()) and not _unmarked_workspace(folder):
        names = sorted(p.name for p in folder.iterdir())
        shown = ", ".join(repr(name) for name in names[:3]) + (", ..." if names[3:] else "")
        raise UserError(
            f"{folder}: cannot be the session workspace: it holds {shown} and is not one "
            f"(no {MARK} mark); give a new or empty folder (or the session's own workspace)"
        )
    (folder / MARK).touch()  # empty: it is there or not, whenever the process dies


@contextlib.contextmanager
def naming(path: Path) -> Iterator[None]:
    """An OSError of writing `path` names it (a write or fsync failing on a full disk does
    not), so a warning or message can say which file."""
    try:
        yield
    except OSError as error:
        if error.filename is None:
            error.filename = str(path)
        raise


_HELD: dict[Path, tuple[BinaryIO, int]] = {}  # workspace -> this process's lock, its holders
_GUARD = threading.Lock()  # _HELD between threads


def _forget_inherited() -> None:
    """In a forked child: the parent's locks are the parent's. The child closes its copies (a
    copy kept open would hold the lock after the parent closed its session) and takes a
    workspace only by locking it itself."""
    global _GUARD
    _GUARD = threading.Lock()
    for handle, _ in _HELD.values():
        handle.close()
    _HELD.clear()


os.register_at_fork(after_in_child=_forget_inherited)


def _lock(folder: Path) -> Path:
    """Lock the workspace for this process (flock on its mark, released when the last
    `Workspace` of the folder in this process is gone, or the process ends); another process
    holding it is a UserError naming the folder. Locking needs no write access."""
    with _GUARD:
        return _locked(folder)


def _locked(folder: Path) -> Path:
    key = folder.resolve()
    if key not in _HELD:
        handle = open(folder / MARK, "rb")  # noqa: SIM115 (held while the workspace is open)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise UserError(
                f"{folder}: another process is using this session workspace (one process at a "
                "time); close its session or give this one another workspace"
            ) from None
        _HELD[key] = (handle, 0)
    handle, holders = _HELD[key]
    _HELD[key] = (handle, holders + 1)
    return key


def _unlock(key: Path) -> None:
    with _GUARD:
        if key not in _HELD:  # closed in a forked child that never locked it
            return
        handle, holders = _HELD[key]
        if holders > 1:
            _HELD[key] = (handle, holders - 1)
            return
        del _HELD[key]
        handle.close()  # closing the file releases the flock


def _unmarked_workspace(folder: Path) -> bool:
    """A workspace of a version before marks: a readable session state, and nothing else."""
    try:
        state = json.loads(read_regular(folder / "state.json", STATE_LIMIT))
    except (OSError, UserError, ValueError, RecursionError):
        return False
    names = [p.name for p in folder.iterdir()]
    known = all(name in ENTRIES or _temporary(name, ENTRIES) for name in names)
    return known and isinstance(state, dict) and state.get("format") == FORMAT


def _temporary(name: str, entries: tuple[str, ...]) -> bool:
    """Whether `name` is a temporary of an atomic write of one of `entries` (`fileio`)."""
    return any(name.startswith(f".{entry}.") for entry in entries)


_ARTIFACT = {"path": str, "sha256": str}
_STATE_TYPES = {  # key -> the JSON types `Session._write_state` writes
    "source": str,
    "state": str,
    "done": bool,
    "reason": (str, type(None)),
    "settings": (dict, type(None)),
    "artifacts": dict,
    "gates": dict,
    "choice": (dict, type(None)),
    "qpath": (str, type(None)),
    "cpath": (str, type(None)),
}
STATES = ("INITIAL", "QUANTIZED", "COMPILED")


def _wrong_keys(state: dict) -> list[str]:
    """The keys of a saved state whose values are not what a session writes."""
    wrong = [k for k, t in _STATE_TYPES.items() if k in state and not isinstance(state[k], t)]
    if isinstance(state.get("state"), str) and state["state"] not in STATES:
        wrong.append("state")
    artifacts = state.get("artifacts")
    if isinstance(artifacts, dict):
        for kind, artifact in artifacts.items():
            fine = isinstance(artifact, dict) and all(
                isinstance(artifact.get(k), t) for k, t in _ARTIFACT.items()
            )
            if not fine:
                wrong.append(f"artifacts.{kind}")
    gates = state.get("gates")
    if isinstance(gates, dict):
        for kind, gate in gates.items():
            if not (isinstance(gate, dict) and isinstance(gate.get("passed"), bool)):
                wrong.append(f"gates.{kind}")
    return wrong
