"""Code tables of the TRIX simulator: an elementwise layer of two 8-bit operands, a concat
part or a requant layer looks its output codes up in a table made once per layer by the
integer rules over every input code (or pair of codes), where the layer's output is at least as
large as the table (a concat part whose every code maps to itself is not looked up)."""

import math

import numpy as np

from ...graph_ir.quant.params import requantize
from .codegen import Module
from .exact import all_codes, elementwise, lookup, saturate
from .lower import Layer


class CodeTables:
    def __init__(self, module: Module):
        self.module = module
        self.tables: dict[tuple, np.ndarray | None] = {}  # (layer, part) -> output codes

    def pairwise(self, layer: Layer, x: np.ndarray, b: np.ndarray) -> np.ndarray:
        """`elementwise(layer, x, b)` as codes of the output; where both operands are 8-bit,
        looked up in a table of every pair of codes made once with `elementwise` itself (when
        the layer's output, over all its tiles, is at least as large as the table, or it
        exists)."""
        key = (layer.name, "pair")
        small = key not in self.tables and self._output_size(layer) < 1 << 16
        if x.itemsize != 1 or b.itemsize != 1 or small:
            return elementwise(layer, x, b).astype(self.module.tensors[layer.output].dtype)
        if key not in self.tables:
            table = elementwise(layer, *np.ix_(all_codes(x.dtype), all_codes(b.dtype)))
            self.tables[key] = table.astype(self.module.tensors[layer.output].dtype).ravel()
        return lookup(self.tables[key], x, b)

    def rescaled(self, layer: Layer, x: np.ndarray, part: int, zero_point, m, r) -> np.ndarray:
        """Saturated requantize(x - zero_point, m, r) (a requant layer, or part `part` of a
        concat), looked up in a table of every input code made once with that formula (when
        the layer's output is at least as large as the table, or it exists)."""
        key = (layer.name, part)
        if key not in self.tables and self._output_size(layer) < 1 << (8 * x.itemsize):
            return saturate(layer, requantize(x.astype(np.int64) - zero_point, m, r))
        if key not in self.tables:
            codes = all_codes(x.dtype)
            table = saturate(layer, requantize(codes.astype(np.int64) - zero_point, m, r))
            table = table.astype(self.module.tensors[layer.output].dtype)
            same = table.dtype == x.dtype and np.array_equal(table, codes)
            self.tables[key] = None if same else table  # None: every code maps to itself
        table = self.tables[key]
        return x if table is None else lookup(table, x)

    def _output_size(self, layer: Layer) -> int:
        return math.prod(self.module.tensors[layer.output].shape)
