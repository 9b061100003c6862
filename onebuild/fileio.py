"""Atomic file output: write to a temporary file in the same folder, fsync, rename.

A killed process leaves at most a stray temporary file, never a truncated artifact under the
final name. A folder is replaced only if the caller recognizes it as one onebuild wrote
(`atomic_folder`'s `owned`). Inputs are read only from regular files of bounded size
(`read_regular`). Leaf module: it imports nothing else of onebuild but its errors.
"""

import contextlib
import errno
import hashlib
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from .errors import UserError

ANY_SIZE = 1 << 62  # `open_regular`'s limit for files read in pieces or mapped, not held


def open_regular(path: str | os.PathLike, limit: int) -> BinaryIO:
    """Open `path` for reading if it is a regular file of at most `limit` bytes, else raise
    `UserError` naming it (a FIFO, a device or a folder would hang or exhaust memory). Opened
    without blocking, so a FIFO is refused, not waited on; a missing file raises
    `FileNotFoundError`, other failures (a symlink loop, permissions) `OSError` naming it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise
    except OSError as error:
        if error.errno == errno.ENXIO:  # a socket
            raise UserError(f"{path}: is a socket, not a regular file; put a file there") from None
        raise OSError(error.errno, error.strerror, str(path)) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = "a folder" if stat.S_ISDIR(info.st_mode) else "a FIFO, device or socket"
            raise UserError(f"{path}: is {kind}, not a regular file; put a file there")
        if info.st_size > limit:
            raise UserError(
                f"{path}: is {info.st_size} bytes, more than the {limit} onebuild reads from "
                "such a file; check it is the file you meant"
            )
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def file_digest(path: str | os.PathLike) -> str:
    """The SHA-256 (hex) of a regular file, read in pieces (`open_regular`)."""
    with open_regular(path, ANY_SIZE) as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def stamp(info: os.stat_result) -> list[int]:
    """What changes whenever a file's content may have: size, modification and status-change
    times, inode. The modification time alone does not (`cp -p`, `rsync -a`, wheels' fixed
    zip times and `touch -d` set it to anything); the status-change time cannot be set."""
    return [info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino]


def not_a_file(path: str | os.PathLike) -> UserError:
    """The error for an input `path` that is not a regular file: missing, or something else."""
    path = Path(path)
    if path.exists() or path.is_symlink():  # a folder, a FIFO, a device, a symlink loop
        return UserError(f"{path}: is not a regular file (a folder, FIFO or device?); name a file")
    return UserError(f"{path}: no such file")


def read_regular(path: str | os.PathLike, limit: int) -> bytes:
    """The bytes of a regular file of at most `limit` bytes (see `open_regular`); a file that
    grows past `limit` while read is refused as well."""
    with open_regular(path, limit) as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise UserError(f"{path}: grew past {limit} bytes while read; try again")
    return data


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """Open a binary temporary file that replaces `path` only if the block completes."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a folder; name a file to write", str(path))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as error:  # name the file the caller asked for, not the temporary
        blocker = not_a_folder(path.parent)
        reason = f"{blocker} is not a folder" if blocker else error.strerror
        raise OSError(error.errno, f"cannot write it ({reason})", str(path)) from None
    os.fchmod(fd, 0o666 & ~current_umask())  # mkstemp creates 0600; artifacts are shared files
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as error:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(error, OSError) and error.filename in (None, tmp):  # a full disk, ...
            raise OSError(error.errno, f"cannot write it ({error.strerror})", str(path)) from None
        raise


def not_a_folder(folder: Path) -> Path | None:
    """The first of `folder` and its parents that is there but not a folder (a file, a broken
    symlink or a symlink loop), which makes creating `folder` fail with "File exists"."""
    for item in [*reversed(folder.parents), folder]:
        if (item.exists() or item.is_symlink()) and not item.is_dir():
            return item
    return None


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_writer(path) as handle:
        handle.write(data)


def check_folder_output(path: Path, owned: Callable[[Path], bool], what: str) -> None:
    """Refuse (one line naming `path`) to write the folder `path` unless its parent folder
    exists and nothing is there, an empty folder, or a folder `owned` recognizes as `what`
    onebuild wrote."""
    fix = "move it away or choose another path"
    if not path.parent.is_dir():
        raise UserError(
            f"{path}: folder {path.parent} does not exist; onebuild creates no folders: create "
            "it or choose another path"
        )
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        raise UserError(f"{path}: exists and is not a folder, so it is not replaced: {fix}")
    if path.is_dir() and any(path.iterdir()) and not owned(path):
        raise UserError(
            f"{path}: exists and is not {what} onebuild wrote, so it is not replaced: {fix}"
        )


@contextlib.contextmanager
def atomic_folder(
    path: str | os.PathLike, owned: Callable[[Path], bool], what: str
) -> Iterator[Path]:
    """A temporary sibling folder that replaces the folder `path` only if the block completes;
    an existing `path` is replaced only if `owned` recognizes it (see `check_folder_output`)."""
    path = Path(path)
    check_folder_output(path, owned, what)
    temporary = str(path.parent / f".{path.name}.")
    staging = None
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
        staging.chmod(0o777 & ~current_umask())
        yield staging
        if path.exists():
            trash = Path(tempfile.mkdtemp(prefix=f".{path.name}.old.", dir=path.parent))
            os.replace(path, trash / "old")
            os.replace(staging, path)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(staging, path)
    except OSError as error:  # a full disk, ...: name the folder asked for, not a temporary
        if error.filename is None or str(error.filename).startswith(temporary):
            reason = error.strerror or ""
            reason = (
                reason if reason.startswith("cannot write it") else f"cannot write it ({reason})"
            )
            raise OSError(error.errno, reason, str(path)) from None
        raise
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
