"""ONE's calibration data format: an HDF5 file as one-quantize and record-minmax read it.

Layout (rawdata2hdf5 writes it): a group `value` holding one group per sample, named `0`, `1`,
...; in each, one dataset per model input, named by its position `0`, `1`, .... A dataset is
either an array of the input's shape, or (with the attribute `rawData` on `value`) the raw
bytes of the input in its own dtype (float32, or an integer input's type: indices stay
integers). Read with h5py (the `onecc` extra), shapes and sizes checked before data, at most
CHUNK_SAMPLES samples in memory at a time (the data limit applies to them); nothing is executed
or unpickled. Only data stored in the file itself is read: soft and external links, external
storage and virtual datasets (which read other files, FIFOs or devices) are refused.
"""

from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from .errors import FormatError, UserError
from .fileio import ANY_SIZE, open_regular
from .npz import byte_limit

HDF5_SUFFIXES = (".h5", ".hdf5")
CHUNK_SAMPLES = 64
FLOAT = np.dtype(np.float32)


def _h5py():
    try:
        import h5py
    except ImportError:
        raise UserError(
            "reading ONE's HDF5 input data needs h5py: pip install 'onebuild[onecc]' (or save "
            "the samples as .npz)"
        ) from None
    return h5py


def _check_link(h5py, path: Path, group, name: str, where: str | None = None) -> None:
    """Refuse a soft or external link (other files, loops): only the file's own objects."""
    link = group.get(name, getlink=True)
    if isinstance(link, (h5py.SoftLink, h5py.ExternalLink)):
        kind = "an external link" if isinstance(link, h5py.ExternalLink) else "a soft link"
        raise FormatError(
            f"{path}: {where or name} is {kind}; onebuild reads only data stored in the .h5 file "
            "itself: copy the data into it"
        )


def _sample_names(path: Path, group) -> list[str]:
    names = list(group.keys())
    if not names or not all(name.isascii() and name.isdecimal() for name in names):
        raise FormatError(f"{path}: the 'value' group must hold samples named 0, 1, ...")
    return sorted(names, key=int)


def _input_array(path: Path, sample: str, dataset, raw: bool, shape, dtype) -> np.ndarray:
    """The dataset as the input's array: raw bytes decoded as `dtype`, arrays converted to it
    (an integer input takes integer data only)."""
    where = f"{path}: value/{sample}/{dataset.name.rsplit('/', 1)[-1]}"
    if dataset.dtype.kind not in "biuf" or dataset.dtype.fields is not None:
        raise FormatError(f"{where}: {dataset.dtype} is not numbers")
    if dataset.shape is None:
        raise FormatError(f"{where}: an empty dataset")
    if raw:
        count = int(dataset.size) * dataset.dtype.itemsize
        expected = int(np.prod(shape)) * dtype.itemsize
        if count != expected:
            raise FormatError(f"{where}: {count} bytes, the input {list(shape)} needs {expected}")
    elif tuple(dataset.shape) != tuple(shape):
        raise FormatError(f"{where}: shape {list(dataset.shape)}, the input is {list(shape)}")
    data = dataset[()]
    if raw:
        return np.frombuffer(np.asarray(data).tobytes(), dtype).reshape(shape)
    if dtype.kind != "f" and not np.can_cast(dataset.dtype, dtype, "same_kind"):
        raise FormatError(f"{where}: {dataset.dtype} data, the input is {dtype}")
    return np.asarray(data, dtype).reshape(shape)


def iter_hdf5(
    path: str | Path, inputs: Sequence[tuple]
) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
    """Batches `(where, {input name: [N, *shape]})` of at most CHUNK_SAMPLES samples each, for
    `inputs` (name, shape[, dtype]; float32 when not given)."""
    inputs = [(name, tuple(shape), np.dtype(rest[0] if rest else FLOAT))
              for name, shape, *rest in inputs]  # fmt: skip
    h5py, path = _h5py(), Path(path)
    open_regular(path, ANY_SIZE).close()  # a FIFO or a device would hang or never end
    try:
        handle = h5py.File(path, "r")
    except OSError as error:
        raise FormatError(f"{path}: not an HDF5 file ({error})") from None
    with handle:
        _check_link(h5py, path, handle, "value")
        group = handle.get("value")
        if not isinstance(group, h5py.Group):
            raise FormatError(f"{path}: no 'value' group (ONE's input data layout)")
        raw = "rawData" in group.attrs
        names = _sample_names(path, group)
        sample_bytes = sum(int(np.prod(shape)) * dtype.itemsize for _, shape, dtype in inputs)
        if sample_bytes * min(len(names), CHUNK_SAMPLES) > byte_limit():
            raise UserError(
                f"{path}: {CHUNK_SAMPLES} samples of {sample_bytes} bytes at a time exceed the "
                "data limit (ONEBUILD_MAX_NPZ_BYTES)"
            )
        for start in range(0, len(names), CHUNK_SAMPLES):
            chunk = names[start : start + CHUNK_SAMPLES]
            batch = {name: [] for name, *_ in inputs}
            for sample in chunk:
                try:
                    _read_sample(h5py, path, group, sample, inputs, raw, batch)
                except (OSError, KeyError, ValueError, TypeError) as error:
                    first = str(error).splitlines()[0] if str(error) else type(error).__name__
                    raise FormatError(f"{path}: value/{sample} cannot be read ({first})") from None
            where = f"{path} (samples {chunk[0]}-{chunk[-1]})"
            yield where, {name: np.stack(arrays) for name, arrays in batch.items()}


def _read_sample(h5py, path: Path, group, sample: str, inputs, raw: bool, batch) -> None:
    """Append each input's array of sample `sample` to `batch`."""
    _check_link(h5py, path, group, sample, f"value/{sample}")
    datasets = group.get(sample)
    for name in datasets if isinstance(datasets, h5py.Group) else ():
        _check_link(h5py, path, datasets, name, f"value/{sample}/{name}")
    if not isinstance(datasets, h5py.Group) or len(datasets) != len(inputs):
        raise FormatError(
            f"{path}: value/{sample} must hold {len(inputs)} dataset(s), one per model input"
        )
    for index, (name, shape, dtype) in enumerate(inputs):
        where = f"value/{sample}/{index}"
        dataset = datasets.get(str(index))
        if not isinstance(dataset, h5py.Dataset):
            raise FormatError(f"{path}: value/{sample} has no dataset '{index}'")
        if dataset.external or dataset.is_virtual:
            kind = "external storage" if dataset.external else "a virtual dataset"
            raise FormatError(
                f"{path}: {where} is {kind} (its data is in other files); onebuild reads only "
                "data stored in the .h5 file: copy the data into it"
            )
        batch[name].append(_input_array(path, sample, dataset, raw, shape, dtype))
