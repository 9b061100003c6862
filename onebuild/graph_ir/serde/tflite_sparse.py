"""TFLite sparse constants (`SparsityParameters`: pruned weights that DENSIFY expands at run
time, as in MediaPipe's pose and full-range face detectors) read as dense arrays.

The stored values come in traversal order: one level per entry of `traversal_order`, the
tensor's dimensions first, then one per block dimension (`block_map` names the dimension each
block splits). A DENSE level visits every index below its `dense_size`; a SPARSE_CSR level
visits, under parent p, the indices `array_indices[array_segments[p]:array_segments[p + 1]]`.
"""

import math

import numpy as np

from ...errors import ModelError
from .flatbuf import Table

DENSE, SPARSE_CSR = 0, 1
INDEX_VECTORS = {1: "int32", 2: "uint16", 3: "uint8"}  # the SparseIndexVector union


def densify(sparsity: Table, values: np.ndarray, shape: tuple[int, ...], what: str):
    """The dense array of shape `shape` whose nonzero entries `values` and `sparsity` give."""
    order = [int(i) for i in sparsity.array(0, "int32", f"{what} traversal order")]
    block_map = [int(i) for i in sparsity.array(1, "int32", f"{what} block map")]
    levels = sparsity.tables(2, f"{what} dimension metadata")
    rank = len(shape)
    if sorted(order) != list(range(rank + len(block_map))) or len(levels) != len(order):
        raise ModelError(f"{what}: inconsistent sparsity (traversal order {order})")
    total = math.prod(shape)  # no level visits more positions than the dense tensor has
    parents = np.zeros(1, np.int64)  # the position of each element so far in its level
    coords: list[np.ndarray] = []
    for level in levels:
        if level.scalar(0, "b") == DENSE:
            size = level.scalar(1, "i")
            if size < 0 or len(parents) * size > total:
                raise ModelError(f"{what}: a dense sparsity level of size {size}")
            counts = np.full(len(parents), size, np.int64)
            children = np.repeat(parents * size, counts) + _ranks(counts)
            index = _ranks(counts)
        else:
            segments = _index_vector(level, 2, f"{what} array segments")
            indices = _index_vector(level, 4, f"{what} array indices")
            if len(segments) <= parents.max(initial=0) + 1 or np.any(np.diff(segments) < 0):
                raise ModelError(f"{what}: sparse segments do not fit their indices")
            counts = segments[parents + 1] - segments[parents]
            if counts.sum() > total:
                raise ModelError(f"{what}: sparse segments hold more than the tensor")
            children = np.repeat(segments[parents], counts) + _ranks(counts)
            if children.size and children.max() >= len(indices):
                raise ModelError(f"{what}: sparse segments point past their indices")
            index = indices[children]
        coords = [np.repeat(c, counts) for c in coords] + [index]
        parents = children
    if len(parents) != values.size:
        raise ModelError(f"{what}: {values.size} stored values for {len(parents)} positions")
    by_dimension = dict(zip(order, coords))
    full = []
    for axis in range(rank):
        coord = by_dimension[axis]
        if axis in block_map:
            block = rank + block_map.index(axis)
            size = levels[order.index(block)].scalar(1, "i")
            coord = coord * size + by_dimension[block]
        if coord.size and (coord.min() < 0 or coord.max() >= shape[axis]):
            raise ModelError(f"{what}: a sparse index lies outside dimension {axis}")
        full.append(coord)
    dense = np.zeros(shape, values.dtype)
    dense[tuple(full)] = values.reshape(-1)
    return dense


def _ranks(counts: np.ndarray) -> np.ndarray:
    """0, 1, ..., count - 1 for each count, concatenated."""
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    return np.arange(int(counts.sum()), dtype=np.int64) - starts


def _index_vector(level: Table, slot: int, what: str) -> np.ndarray:
    """A SparseIndexVector union (type at `slot`, table at `slot + 1`) as int64."""
    kind = level.scalar(slot, "B")
    table = level.table(slot + 1, what)
    if kind not in INDEX_VECTORS or table is None:
        raise ModelError(f"{what}: missing or unknown index vector type {kind}")
    return table.array(0, INDEX_VECTORS[kind], what).astype(np.int64)
