"""Sample sets for calibration and evaluation: an npz file, a folder of npz/npy files, ONE's
HDF5 input data (`hdf5_data`), or random data (only when asked for: it calibrates badly).

Batches are yielded one file at a time as `(where, {input name: [N, *shape]})`, so a folder of
many files is never held in memory at once. A folder's `.npz` files hold arrays keyed by input
name, `[N, *shape]` or a single sample `[*shape]` (for an input of batch 1, `[N, *shape[1:]]`
too: samples stacked on the batch axis, as onnxruntime's calibration readers hold them); `.npy`
files serve single-input models.
Files are read with `onebuild.npz`'s checks (sizes before data, no pickles); samples must hold
at least one sample and only finite numbers (an error names the file, the input and the sample).
"""

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from .errors import FormatError, UserError
from .hdf5_data import HDF5_SUFFIXES, iter_hdf5
from .npz import MAX_HEADER, NPY_MAGIC, byte_limit, check_finite, read_npz

Batch = dict[str, np.ndarray]


def _sample_axis(array: np.ndarray, shape: tuple[int, ...] | None) -> np.ndarray:
    """`array` as [N, *shape]: a single sample gets the axis; a stack of N samples of an input
    of batch 1 on its batch axis ([N, *shape[1:]]) gets it after N."""
    if shape is None or array.ndim != len(shape):
        return array
    if array.shape == shape:
        return array[None]
    if shape[:1] == (1,) and array.shape[1:] == shape[1:]:
        return array[:, None]
    return array


def _with_sample_axis(
    where: str, arrays: Batch, shapes: dict[str, tuple[int, ...]]
) -> tuple[str, Batch]:
    batch = {name: _sample_axis(a, shapes.get(name)) for name, a in arrays.items()}
    for name in shapes:
        if name in batch and (batch[name].ndim == 0 or not len(batch[name])):
            raise UserError(f"{where}: input '{name}' has no samples")
    check_finite({name: a for name, a in batch.items() if name in shapes}, where)
    return where, batch


def _read_npy(path: Path) -> np.ndarray:
    """A .npy file, its header and size checked before the data is read (no pickles)."""
    with open(path, "rb") as handle:
        if handle.read(len(NPY_MAGIC)) != NPY_MAGIC:
            raise FormatError(f"{path}: not a .npy file (bad magic)")
        handle.seek(0)
        try:
            version = np.lib.format.read_magic(handle)
            read = {(1, 0): np.lib.format.read_array_header_1_0}.get(
                version, np.lib.format.read_array_header_2_0
            )
            shape, fortran, dtype = read(handle, MAX_HEADER)
        except (ValueError, TypeError, SyntaxError, EOFError, OverflowError) as error:
            message = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise FormatError(f"{path}: no valid .npy header ({message})") from None
        if dtype.hasobject or dtype.kind not in "biuf" or dtype.fields is not None:
            raise FormatError(f"{path}: unsupported dtype {dtype} (numbers only; no pickles)")
        if not all(isinstance(d, int) and d >= 0 for d in shape):
            raise FormatError(f"{path}: invalid shape {list(shape)}")
        nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
        size = os.fstat(handle.fileno()).st_size - handle.tell()
        if size != nbytes:
            raise FormatError(
                f"{path}: the header {dtype.str}{list(shape)} needs {nbytes} data bytes, the "
                f"file has {size} (truncated or inconsistent)"
            )
        if nbytes > byte_limit():
            raise FormatError(f"{path}: {nbytes} bytes of data exceed the npz/npy size limit")
        array = np.fromfile(handle, dtype, int(np.prod(shape, dtype=object)))
    array = array.reshape(shape, order="F" if fortran else "C")
    return np.ascontiguousarray(array.astype(dtype.newbyteorder("="), copy=False))


def iter_batches(path: str | os.PathLike, inputs: Sequence[tuple]) -> Iterator[tuple[str, Batch]]:
    """Batches of the npz file or folder at `path` for a model with `inputs` (name, shape[,
    dtype]: HDF5 data is read in the input's dtype, float32 when not given)."""
    path = Path(path)
    shapes = {name: shape for name, shape, *_ in inputs}
    if path.is_file() and path.suffix.lower() in HDF5_SUFFIXES:
        for where, batch in iter_hdf5(path, inputs):
            yield _with_sample_axis(where, batch, shapes)
        return
    if path.is_file():
        yield _with_sample_axis(str(path), read_npz(path), shapes)
        return
    if not path.is_dir():
        raise UserError(f"{path}: no such file or folder")
    files = sorted(p for p in path.iterdir() if p.suffix in (".npz", ".npy") and p.is_file())
    if not files:
        raise UserError(f"{path}: the folder has no .npz or .npy files")
    for file in files:
        if file.suffix == ".npz":
            yield _with_sample_axis(str(file), read_npz(file), shapes)
        elif len(shapes) != 1:
            raise UserError(
                f"{file}: .npy files only serve single-input models; this model has inputs "
                f"{', '.join(shapes)} (use .npz files keyed by input name)"
            )
        else:
            (name,) = shapes
            yield _with_sample_axis(str(file), {name: _read_npy(file)}, shapes)


def random_batch(inputs: Sequence[tuple], samples: int, seed: int = 0) -> tuple[str, Batch]:
    """Uniform [0, 1) samples for every float input (a fixed seed: builds stay deterministic);
    zeros for an integer input (name, shape, dtype), the one index every axis has."""
    rng = np.random.default_rng(seed)
    batch = {}
    for name, shape, *dtype in inputs:
        if dtype and np.dtype(dtype[0]).kind != "f":
            batch[name] = np.zeros((samples, *shape), dtype[0])
        else:
            batch[name] = rng.random((samples, *shape), dtype=np.float32)
    return "random data", batch


def first_samples(
    path: str | os.PathLike, inputs: Sequence[tuple[str, tuple[int, ...]]], count: int
) -> list[Batch]:
    """The first `count` samples of the data at `path` (fewer if it holds fewer), as batches."""
    batches, taken = [], 0
    for _, batch in iter_batches(path, inputs):
        if taken >= count:
            break
        size = len(next(iter(batch.values())))
        keep = min(size, count - taken)
        batches.append({name: array[:keep] for name, array in batch.items()})
        taken += keep
    return batches
