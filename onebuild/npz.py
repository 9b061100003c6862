"""npz files, the batch format used everywhere in onebuild.

One array per model input (or output), keyed by name, shape `[N, *shape]` (sample axis first).
Reading never unpickles; writing is deterministic (fixed zip timestamps, sorted keys) and atomic.
"""

import io
import os
import zipfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from .errors import FormatError, UserError
from .fileio import atomic_write_bytes


def read_npz(path: str | os.PathLike) -> dict[str, np.ndarray]:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    try:
        with np.load(path, allow_pickle=False) as archive:
            if not isinstance(archive, np.lib.npyio.NpzFile):
                raise FormatError(f"{path}: expected an .npz archive, found a single .npy array")
            return {name: archive[name] for name in archive.files}
    except FormatError:
        raise
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as error:
        raise FormatError(f"{path}: not a readable npz file ({error})") from None


def npz_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        for name in sorted(arrays):
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            member = io.BytesIO()
            np.lib.format.write_array(member, np.asarray(arrays[name]), allow_pickle=False)
            archive.writestr(info, member.getvalue())
    return buffer.getvalue()


def write_npz(path: str | os.PathLike, arrays: Mapping[str, np.ndarray]) -> None:
    atomic_write_bytes(path, npz_bytes(arrays))
