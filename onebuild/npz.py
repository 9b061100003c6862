"""npz files, the batch format used everywhere in onebuild.

One array per model input (or output), keyed by name, shape `[N, *shape]` (sample axis first).
Writing is deterministic (fixed zip timestamps, sorted keys) and atomic.

Reading never unpickles and never trusts a size it has not checked: the zip directory is read
first (duplicate or non-`.npy` members, encrypted members and member counts are rejected), then
each member's `.npy` header is parsed and its shape x dtype must account for exactly the
member's declared uncompressed size, and the sum of those sizes must stay under a limit
(`ONEBUILD_MAX_NPZ_BYTES`, 1 GiB by default) before a single data byte is decompressed, so a
small file cannot expand into gigabytes in memory. Object, structured and opaque dtypes are
rejected; Fortran-ordered arrays are returned C-ordered, big-endian ones in native byte order.
Every problem is a one-line `FormatError` naming the file (and the member).
"""

import io
import os
import zipfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from .errors import FormatError, UserError
from .fileio import atomic_write_bytes

NPY_MAGIC = b"\x93NUMPY"
ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")  # a member first, or an empty archive
MAX_MEMBERS = 4096
MAX_HEADER = 10_000  # bytes of a .npy header dict (numpy's own default limit)
DEFAULT_LIMIT = 1 << 30
LIMIT_VARIABLE = "ONEBUILD_MAX_NPZ_BYTES"
KINDS = "biufcUS"  # bool, integers, floats, complex, unicode and byte strings
CHUNK = 16 << 20


class Arrays(dict):
    """The arrays of one npz file by name; `source` is the file, for error messages."""

    source: str = "input data"


def source_of(arrays: Mapping[str, np.ndarray], default: str = "input data") -> str:
    """The file `arrays` were read from (when they came from `read_npz`), else `default`."""
    return getattr(arrays, "source", default)


def from_file(where: str, error: UserError) -> UserError:
    """`error` as a one-line UserError that names `where` (the data file) first, once."""
    message = str(error)
    return UserError(message if message.startswith(f"{where}:") else f"{where}: {message}")


def byte_limit() -> int:
    """The most bytes of array data one npz file may expand to (env ONEBUILD_MAX_NPZ_BYTES)."""
    text = os.environ.get(LIMIT_VARIABLE, "")
    try:
        return int(text) if text else DEFAULT_LIMIT
    except ValueError:
        raise UserError(f"{LIMIT_VARIABLE}={text!r} is not a number of bytes") from None


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def read_npz(path: str | os.PathLike, *, batch: bool = True) -> Arrays:
    """The arrays of the npz file at `path` by name (see the module docstring for the checks).

    With `batch` (the default: model inputs, labels, sample sets) the archive must hold at
    least one array and no array may have an empty sample axis (0-d arrays are left to the
    shape checks of whoever uses them).
    """
    path = Path(path)
    if not path.is_file():
        if path.exists() or path.is_symlink():  # a folder, a FIFO, a device, a symlink loop
            raise FormatError(f"{path}: is not a regular file, so not an npz file; name one")
        raise UserError(f"{path}: no such file")
    with open(path, "rb") as handle:
        head = handle.read(8)
    if head.startswith(NPY_MAGIC):
        raise FormatError(
            f"{path}: a single .npy array, not an .npz archive (write one with "
            f"np.savez(path, input=array), keyed by the model's input name)"
        )
    if not head.startswith(ZIP_MAGICS):
        raise FormatError(f"{path}: not an npz file (not a zip archive of .npy arrays)")
    try:
        with zipfile.ZipFile(path) as archive:
            arrays = _read_archive(path, archive)
    except FormatError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError) as error:
        raise FormatError(f"{path}: corrupt npz file ({error})") from None
    except (RuntimeError, NotImplementedError) as error:  # encrypted, unknown compression
        raise FormatError(f"{path}: unreadable npz member ({error})") from None
    if batch:
        _check_batch(path, arrays)
    result = Arrays(arrays)
    result.source = str(path)
    return result


def _read_archive(path: Path, archive: zipfile.ZipFile) -> dict[str, np.ndarray]:
    infos = archive.infolist()
    if len(infos) > MAX_MEMBERS:
        raise FormatError(f"{path}: {len(infos)} members; an npz file may hold {MAX_MEMBERS}")
    seen: set[str] = set()
    for info in infos:
        if info.filename in seen:
            raise FormatError(
                f"{path}: member '{info.filename}' appears twice (ambiguous; rewrite the file "
                f"with np.savez)"
            )
        seen.add(info.filename)
        if not info.filename.endswith(".npy") or info.is_dir() or info.filename == ".npy":
            raise FormatError(f"{path}: member '{info.filename}' is not a .npy array")
        if info.flag_bits & 0x1:
            raise FormatError(f"{path}: member '{info.filename}' is encrypted")
    limit, total, headers = byte_limit(), 0, []
    for info in infos:  # every header and size first: nothing large is decompressed yet
        with archive.open(info) as member:
            dtype, shape, fortran, offset = _header(path, info, member)
        nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize if shape else dtype.itemsize
        where = f"{path}: member '{info.filename}'"
        if info.file_size != offset + nbytes:
            raise FormatError(
                f"{where} declares {info.file_size} bytes but its header {dtype.str}"
                f"{list(shape)} needs {offset + nbytes} (truncated or inconsistent)"
            )
        total += nbytes
        if total > limit:
            raise FormatError(
                f"{path}: arrays expand to more than {_size(limit)} (at least {_size(total)}); "
                f"split the data into a folder of npz files or raise {LIMIT_VARIABLE}"
            )
        headers.append((info, dtype, shape, fortran, offset))
    arrays = {}
    for info, dtype, shape, fortran, offset in headers:
        arrays[info.filename[:-4]] = _data(path, archive, info, dtype, shape, fortran, offset)
    return arrays


def _header(path: Path, info: zipfile.ZipInfo, member) -> tuple[np.dtype, tuple, bool, int]:
    """dtype, shape, Fortran order and data offset of a member, from its .npy header only."""
    where = f"{path}: member '{info.filename}'"
    try:
        version = np.lib.format.read_magic(member)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(member, MAX_HEADER)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(member, MAX_HEADER)
        else:
            raise ValueError(f"unsupported .npy version {version}")
    except (ValueError, TypeError, SyntaxError, EOFError, OverflowError) as error:
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise FormatError(f"{where} has no valid .npy header ({message})") from None
    if dtype.hasobject:
        raise FormatError(f"{where} holds Python objects (dtype {dtype}); onebuild never unpickles")
    if dtype.kind not in KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise FormatError(f"{where} has unsupported dtype {dtype.str} (numbers or strings only)")
    if not all(isinstance(d, int) and d >= 0 for d in shape):
        raise FormatError(f"{where} has an invalid shape {list(shape)}")
    if dtype.itemsize == 0:
        raise FormatError(f"{where} has a zero-size dtype {dtype.str}")
    return dtype, shape, fortran, member.tell()


def _data(path: Path, archive, info, dtype: np.dtype, shape, fortran: bool, offset: int):
    """Decompress exactly the declared data into a new array (in chunks; a member that
    expands to more or fewer bytes than declared is rejected)."""
    flat = np.empty(int(np.prod(shape, dtype=object)) if shape else 1, dtype)
    buffer = memoryview(flat.view(np.uint8).reshape(-1))
    with archive.open(info) as member:
        member.read(offset)
        done = 0
        while done < len(buffer):
            chunk = member.read(min(CHUNK, len(buffer) - done))
            if not chunk:
                raise FormatError(
                    f"{path}: member '{info.filename}' is truncated ({done + offset} of "
                    f"{offset + len(buffer)} bytes)"
                )
            buffer[done : done + len(chunk)] = chunk
            done += len(chunk)
        if member.read(1):  # also makes zipfile check the member's CRC at its end
            raise FormatError(f"{path}: member '{info.filename}' is longer than declared")
    array = flat.reshape(shape, order="F" if fortran else "C")
    if fortran:
        array = np.ascontiguousarray(array)
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    return array


def _check_batch(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    if not arrays:
        raise FormatError(f"{path}: the npz file holds no arrays")
    for name, array in arrays.items():
        if array.ndim and array.shape[0] == 0:
            raise FormatError(f"{path}: array '{name}' has 0 samples (shape {list(array.shape)})")


def check_finite(
    arrays: Mapping[str, np.ndarray], where: str, what: str = "input", batched: bool = True
) -> None:
    """Raise a one-line UserError naming the first array, sample (axis 0, when `batched`) and
    position holding NaN or Inf: quantized models and .tvn programs cannot represent them."""
    for name, array in arrays.items():
        array = np.asarray(array)
        if array.dtype.kind not in "fc" or not array.size:
            continue
        bad = ~np.isfinite(array)
        if not bad.any():
            continue
        first = tuple(int(i) for i in np.argwhere(bad)[0]) if array.ndim else ()
        sample = f" sample {first[0]}" if batched and first else ""
        position = list(first[1:] if batched else first)
        raise UserError(
            f"{where}: {what} '{name}'{sample} contains NaN or Inf ({array[first]} at "
            f"{position}; {int(bad.sum())} such value(s)); a quantized model cannot represent "
            "them: replace them with finite values"
        )


RAW_FIX = "pass --raw to feed codes, or float values to quantize them"


def refuse_codes(name: str, array: np.ndarray, where: str, fix: str = RAW_FIX) -> None:
    """Refuse integer (or bool) data for a quantized input that takes float values: it could
    be codes or values, and quantizing codes as values gives wrong numbers silently."""
    kind = np.asarray(array).dtype.kind
    if kind in "iub":
        raise UserError(
            f"{where}: input '{name}' is quantized and the data is {np.asarray(array).dtype}, "
            f"which could be codes or values; {fix}"
        )


NPZ_MARK = b"written by onebuild"  # the archive comment: what `run -o` may replace


def npz_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    """Deterministic npz bytes: stored members in name order, fixed dates, onebuild's mark."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        archive.comment = NPZ_MARK
        for name in sorted(arrays):
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            member = io.BytesIO()
            np.lib.format.write_array(member, np.asarray(arrays[name]), allow_pickle=False)
            archive.writestr(info, member.getvalue())
    return buffer.getvalue()


def write_npz(path: str | os.PathLike, arrays: Mapping[str, np.ndarray]) -> None:
    atomic_write_bytes(path, npz_bytes(arrays))
