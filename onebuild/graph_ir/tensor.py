"""Constant tensors (in memory, memory-mapped or lazy) and quantization parameters."""

import mmap
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

COPY_CHUNK = 1 << 24


def _aligned_copy(buffer, offset: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    out = np.empty(shape, dtype)
    target = out.reshape(-1).view(np.uint8)
    source = np.frombuffer(buffer, np.uint8, count=target.size, offset=offset)
    page = mmap.PAGESIZE
    release = isinstance(buffer, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED")
    for start in range(0, target.size, COPY_CHUNK):
        stop = min(target.size, start + COPY_CHUNK)
        target[start:stop] = source[start:stop]
        first, last = -(-(offset + start) // page) * page, (offset + stop) // page * page
        if release and last > first:
            buffer.madvise(mmap.MADV_DONTNEED, first, last - first)
    return out


class Tensor:
    """A constant tensor whose data is materialized on first read and then kept.

    Three kinds share this class: `Tensor(array)` holds data in memory, `Tensor.lazy(...)` computes
    it on first read (e.g. a ConstantOfShape fill), and `Tensor.mapped(...)` views bytes of a file
    or buffer without copying them (weights of IR files and ONNX external data).
    """

    __slots__ = ("_array", "_load", "dtype", "shape")

    def __init__(self, array: np.ndarray):
        array = np.asarray(array)
        self._array: np.ndarray | None = array
        self._load: Callable[[], np.ndarray] | None = None
        self.dtype = array.dtype
        self.shape = tuple(int(d) for d in array.shape)

    @classmethod
    def lazy(cls, load: Callable[[], np.ndarray], dtype: np.dtype, shape: tuple[int, ...]):
        t = cls.__new__(cls)
        t._array, t._load = None, load
        t.dtype, t.shape = np.dtype(dtype), tuple(shape)
        return t

    @classmethod
    def mapped(cls, buffer, offset: int, dtype: np.dtype, shape: tuple[int, ...]):
        """A read-only view of `buffer[offset:]` (an mmap or bytes), decoded on first read.

        Data at an offset not aligned for its dtype (weights embedded in an ONNX file) is
        copied once into an aligned array instead (numpy and BLAS would copy an unaligned view
        on every use); the copy runs in chunks and hands each copied chunk's file pages back
        to the OS, so memory holds one copy of the data, not two.
        """
        dtype = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))

        def load() -> np.ndarray:
            if offset % dtype.alignment == 0:
                view = np.frombuffer(buffer, dtype=dtype, count=count, offset=offset)
                return view.reshape(shape)
            return _aligned_copy(buffer, offset, dtype, shape)

        return cls.lazy(load, dtype, shape)

    @property
    def is_loaded(self) -> bool:
        return self._array is not None

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def numpy(self) -> np.ndarray:
        if self._array is None:
            array = np.asarray(self._load())
            if array.dtype != self.dtype or tuple(array.shape) != self.shape:
                raise ValueError(
                    f"lazy tensor produced {array.dtype}{list(array.shape)}, "
                    f"declared {self.dtype}{list(self.shape)}"
                )
            self._array, self._load = array, None
        return self._array

    def __repr__(self) -> str:
        return f"Tensor({self.dtype}{list(self.shape)})"


@dataclass(frozen=True)
class QuantParams:
    """Affine quantization: real = scale * (q - zero_point), per tensor or per channel on `axis`."""

    scale: tuple[float, ...]
    zero_point: tuple[int, ...]
    axis: int | None = None

    def __post_init__(self):
        if len(self.scale) != len(self.zero_point):
            raise ValueError("scale and zero_point must have the same length")
        if self.axis is None and len(self.scale) != 1:
            raise ValueError("per-tensor quantization takes exactly one scale")
