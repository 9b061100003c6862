"""An nnpackage's files, read as untrusted input: zip archives checked and extracted under
limits, every file resolved inside the package folder, every read bounded.

Limits (docs/nnpackage.md): a package holds at most `max_package_bytes()` bytes (2 GiB, or
the `ONEBUILD_MAX_PACKAGE_BYTES` environment variable), counted from the zip's declared sizes
before anything is extracted, or from the files' sizes for a folder; a zip may expand at most
`MAX_RATIO` times its own size once it holds more than `RATIO_FLOOR` bytes, and holds at most
`MAX_MEMBERS` members, each named once, none encrypted, none a symbolic link.
"""

import errno
import os
import stat
import zipfile
import zlib
from pathlib import Path

from ..errors import FormatError
from ..nnpackage import inside_package

DEFAULT_MAX_PACKAGE_BYTES = 2 << 30
MAX_RATIO = 100
RATIO_FLOOR = 16 << 20
MAX_MEMBERS = 4096
ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")  # a local file header, an empty archive's end record
FLATBUFFER_IDS = (b"CIR0", b"TFL3")  # circle, tflite file identifiers (bytes 4..8)
COMPRESSIONS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA)
_CHUNK = 1 << 20


def max_package_bytes() -> int:
    text = os.environ.get("ONEBUILD_MAX_PACKAGE_BYTES", "")
    try:
        return int(text) if text.strip() else DEFAULT_MAX_PACKAGE_BYTES
    except ValueError:
        raise FormatError(f"ONEBUILD_MAX_PACKAGE_BYTES={text!r} is not a number") from None


def looks_like_zip(path: Path) -> bool:
    """A zip archive by its first bytes (a truncated one too), or by its end record when it
    holds a metadata/MANIFEST. A circle/tflite flatbuffer is never one, even with a zip of
    associated files appended (TFLite-Support metadata: MediaPipe, Model Maker, TF Hub)."""
    try:
        if not path.is_file():
            return False
        with open(path, "rb") as handle:
            head = handle.read(8)
        if head[:4] in ZIP_MAGICS:
            return True
        if head[4:8] in FLATBUFFER_IDS or not zipfile.is_zipfile(path):
            return False
        with zipfile.ZipFile(path) as archive:
            return any(name.endswith("metadata/MANIFEST") for name in archive.namelist())
    except (OSError, zipfile.BadZipFile, EOFError, ValueError, NotImplementedError):
        return False


def is_package(path: str | os.PathLike) -> bool:
    """A folder (models are files, so any folder is meant as a package) or a zip archive."""
    path = Path(path)
    return path.is_dir() or looks_like_zip(path)


def extract_zip(path: Path, folder: Path) -> Path:
    """Check the archive's members and declared sizes, then extract it into `folder`; returns
    the package root (the folder holding metadata/MANIFEST)."""
    _check_end_record(path)
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile as error:
        detail = "no end-of-archive record" if "not a zip file" in str(error) else error
        raise FormatError(f"{path}: truncated or corrupt zip archive ({detail})") from None
    except (OSError, EOFError, ValueError, NotImplementedError) as error:
        raise FormatError(f"{path}: unreadable zip archive ({error})") from None
    with archive:
        members = _checked_members(path, archive)
        for name, info in members:
            target = folder / name
            try:
                if info.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                _copy_member(archive, info, target)
            except FormatError as error:
                raise FormatError(f"{path}: corrupt zip archive: {error}") from None
            except (zipfile.BadZipFile, zlib.error, EOFError, OSError, RuntimeError) as error:
                raise FormatError(
                    f"{path}: corrupt zip archive: member '{name}' ({error})"
                ) from None
    manifests = sorted(folder.glob("**/metadata/MANIFEST"))
    if not manifests:
        raise FormatError(f"{path}: not an nnpackage (no metadata/MANIFEST in the zip)")
    return manifests[0].parent.parent


def _check_end_record(path: Path) -> None:
    """The archive's size and member count, before zipfile reads the whole directory."""
    size, limit = path.stat().st_size, max_package_bytes()
    if size > limit:
        raise FormatError(f"{path}: {size:,} bytes, over the package limit of {limit:,}")
    end_record = getattr(zipfile, "_EndRecData", None)  # private, but stable for decades
    if end_record is None:
        return
    try:
        with open(path, "rb") as handle:
            record = end_record(handle)
    except (OSError, ValueError, EOFError):
        return  # zipfile says what is wrong
    if record and record[4] > MAX_MEMBERS:  # total entries in the central directory
        raise FormatError(f"{path}: the zip has {record[4]} members (at most {MAX_MEMBERS})")


def _checked_members(path: Path, archive: zipfile.ZipFile) -> list[tuple[str, zipfile.ZipInfo]]:
    infos = archive.infolist()
    if len(infos) > MAX_MEMBERS:
        raise FormatError(f"{path}: the zip has {len(infos)} members (at most {MAX_MEMBERS})")
    members, seen, total = [], set(), 0
    for info in infos:
        name = inside_package(info.filename, f"{path}: zip member")
        if name in seen:
            raise FormatError(f"{path}: zip member '{name}' appears more than once")
        seen.add(name)
        if info.flag_bits & 0x1:
            raise FormatError(f"{path}: zip member '{name}' is encrypted")
        if info.compress_type not in COMPRESSIONS:
            raise FormatError(
                f"{path}: zip member '{name}' uses unsupported compression {info.compress_type}"
            )
        if stat.S_ISLNK(info.external_attr >> 16):
            raise FormatError(f"{path}: zip member '{name}' is a symbolic link")
        total += info.file_size
        members.append((name, info))
    limit = max_package_bytes()
    if total > limit:
        raise FormatError(
            f"{path}: the zip would extract to {total:,} bytes, over the package limit of "
            f"{limit:,} (ONEBUILD_MAX_PACKAGE_BYTES)"
        )
    size = path.stat().st_size
    if total > RATIO_FLOOR and total > MAX_RATIO * size:
        raise FormatError(
            f"{path}: the zip would extract {size:,} bytes to {total:,} ({total / size:,.0f}-fold; "
            f"a package may expand at most {MAX_RATIO}-fold): refused as a zip bomb"
        )
    return members


def _copy_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, target: Path) -> None:
    """Extract one member, never writing more than its declared size."""
    left = info.file_size
    with archive.open(info) as source, open(target, "wb") as sink:
        while True:
            chunk = source.read(min(_CHUNK, left + 1))
            if not chunk:
                break
            left -= len(chunk)
            if left < 0:
                raise FormatError(f"member '{info.filename}' is larger than declared")
            sink.write(chunk)


def package_file(root: Path, relative: str, shown: str, what: str) -> tuple[Path, int]:
    """`relative` resolved inside the package `root`: an existing regular file, no symlink
    loop, no link out of the package. Returns the file and its size."""
    label = f"{shown}: {what} '{relative}'"
    try:
        base = root.resolve(strict=True)
        file = (root / relative).resolve(strict=True)
    except RuntimeError:  # Python < 3.13 reports symlink loops so
        raise FormatError(f"{label} is a symbolic link loop") from None
    except FileNotFoundError:
        raise FormatError(f"{label} is missing") from None
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise FormatError(f"{label} is a symbolic link loop") from None
        raise FormatError(f"{label} cannot be read ({error.strerror})") from None
    if base not in file.parents:
        raise FormatError(f"{label} points outside the package")
    try:
        status = file.stat()
    except OSError as error:
        raise FormatError(f"{label} cannot be read ({error.strerror})") from None
    if not stat.S_ISREG(status.st_mode):
        raise FormatError(f"{label} is not a regular file")
    return file, status.st_size


def read_bounded(file: Path, limit: int, label: str) -> bytes:
    """At most `limit` bytes of a file; a longer file is an error."""
    try:
        with open(file, "rb") as handle:
            data = handle.read(limit + 1)
    except OSError as error:
        raise FormatError(f"{label} cannot be read ({error.strerror})") from None
    if len(data) > limit:
        raise FormatError(f"{label} is larger than {limit:,} bytes")
    return data


def check_total(sizes: list[int], shown: str) -> None:
    """A package folder's files stay under the package limit."""
    total, limit = sum(sizes), max_package_bytes()
    if total > limit:
        raise FormatError(
            f"{shown}: the package holds {total:,} bytes, over the package limit of {limit:,} "
            "(ONEBUILD_MAX_PACKAGE_BYTES)"
        )
