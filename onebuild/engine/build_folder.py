"""The build folder's lock and task database, and one-line messages for I/O failures."""

import errno
import fcntl
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import FolderBusy, OneBuildError, UserError
from .ownership import claim_build_folder


@contextmanager
def locked(folder: Path, recipe: Path, wait: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold an exclusive lock on a build folder (created or adopted if it is onebuild's); a
    second build or clean stops with a clear message, or with `wait` says so through it and
    waits for the first to finish."""
    claim_build_folder(folder, str(recipe))
    with open(folder / ".lock", "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if wait is None:
                raise FolderBusy(
                    f"{folder}: another onebuild build is using this build folder; wait for it "
                    "(build --wait does)"
                ) from None
            wait(f"{folder}: another onebuild build is using this build folder; waiting for it")
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def busy(folder: Path) -> bool:
    """Whether a build (or clean) holds the folder's lock now (without taking or making it)."""
    try:
        handle = os.open(folder / ".lock", os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(handle)  # releases the shared lock too
    return False


def check_database(db: Path, progress) -> None:
    """A corrupt task database is moved aside (everything reruns or restores), not fatal."""
    if not db.exists():
        return
    try:
        with sqlite3.connect(db) as connection:
            connection.execute("PRAGMA integrity_check").fetchone()
            connection.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError:
        aside = db.with_name(f"{db.name}.corrupt-{int(time.time())}")
        os.replace(db, aside)
        progress(f"task database {db} was corrupt; moved to {aside.name}, rebuilding state")


def os_error_line(error: OSError, output: Path) -> str:
    """A step's I/O failure as one line naming the place: a full disk, permissions, ..."""
    where = error.filename or output.parent
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"{where}: no space left on its device; free space and build again"
    return f"{where}: {error.strerror or error}"


def raise_doit_error(text: str, db: Path) -> None:
    """doit's own failures as one line: a full disk is the user's to fix."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return
    if any(m in text for m in ("database or disk is full", "No space left on device")):
        raise UserError(f"{db.parent}: no space left on its device; free space and build again")
    raise OneBuildError(f"build error: {lines[-1]}")
