"""Sample sets for calibration and evaluation: an npz file, a folder of npz/npy files, or
random data (only when asked for: it calibrates badly).

Batches are yielded one file at a time as `(where, {input name: [N, *shape]})`, so a folder of
many files is never held in memory at once. A folder's `.npz` files hold arrays keyed by input
name, `[N, *shape]` or a single sample `[*shape]`; `.npy` files serve single-input models.
"""

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from .errors import FormatError, UserError
from .npz import read_npz

Batch = dict[str, np.ndarray]


def _with_sample_axis(arrays: Batch, shapes: dict[str, tuple[int, ...]]) -> Batch:
    return {
        name: a[None] if name in shapes and a.shape == shapes[name] else a
        for name, a in arrays.items()
    }


def _read_npy(path: Path) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as error:
        raise FormatError(f"{path}: not a readable npy file ({error})") from None


def iter_batches(
    path: str | os.PathLike, inputs: Sequence[tuple[str, tuple[int, ...]]]
) -> Iterator[tuple[str, Batch]]:
    """Batches of the npz file or folder at `path` for a model with `inputs` (name, shape)."""
    path = Path(path)
    shapes = dict(inputs)
    if path.is_file():
        yield str(path), _with_sample_axis(read_npz(path), shapes)
        return
    if not path.is_dir():
        raise UserError(f"{path}: no such file or folder")
    files = sorted(p for p in path.iterdir() if p.suffix in (".npz", ".npy") and p.is_file())
    if not files:
        raise UserError(f"{path}: the folder has no .npz or .npy files")
    for file in files:
        if file.suffix == ".npz":
            yield str(file), _with_sample_axis(read_npz(file), shapes)
        elif len(shapes) != 1:
            raise UserError(
                f"{file}: .npy files only serve single-input models; this model has inputs "
                f"{', '.join(shapes)} (use .npz files keyed by input name)"
            )
        else:
            (name,) = shapes
            yield str(file), _with_sample_axis({name: _read_npy(file)}, shapes)


def random_batch(
    inputs: Sequence[tuple[str, tuple[int, ...]]], samples: int, seed: int = 0
) -> tuple[str, Batch]:
    """Uniform [0, 1) samples for every input (a fixed seed: builds stay deterministic)."""
    rng = np.random.default_rng(seed)
    return "random data", {
        name: rng.random((samples, *shape), dtype=np.float32) for name, shape in inputs
    }
