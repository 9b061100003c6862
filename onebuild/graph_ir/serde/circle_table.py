"""Any per-tensor 8-bit QLookup in circle / tflite as an integer table: GATHER from a constant
table tensor carrying the output's parameters, indexed by the input codes CAST to int32
(written by `lookup`, folded back by `read_gather`); and the reader's plain CAST and GATHER.

Tables equal to a function of `circle_ops.LOOKUP_FUNCTIONS` keep that function's form (it
reads back named); every other table (HardSigmoid, Exp, Erf, Mish, a Clip with odd bounds, a
table absorbing an affine, ...) is written as

    uint8 codes x -> RESHAPE (same shape) -> CAST int32 -> GATHER(table)
    int8 codes x -> QUANTIZE to uint8 (same scale, zero point + 128) -> RESHAPE -> CAST -> ...

so the index is x - min(dtype) in both cases; an int8 output gathers from the table + 128 (a
uint8 table: onert's GATHER takes no int8 one), then QUANTIZE to int8. The shapes follow what
onert 0.1.0 runs (tried one operator at a time): its CAST takes no int8 input ("Cast:
unsupported data type"); its loader retypes a CAST's input tensor as plain uint8, which then
fails the validation of a quantized producer ("OperationValidator failed"), so a RESHAPE gives
CAST a tensor of its own; and its QUANTIZE from float to int8 clamps to [0, 255] and wraps
(-0.5 at scale 0.01 gives 0, 1.5 gives -106), so the zero-point moves between int8 and uint8
are QUANTIZE of the codes (exact at one scale), in circle as in tflite.
"""

import re

import numpy as np

from ..ops import OPS
from ..tensor import QuantParams
from . import circle_ops as ops
from .circle_read_ops import Malformed, quantize_op
from .tflite_schema import TYPE_CODES

EIGHT_BIT = (np.dtype(np.uint8), np.dtype(np.int8))
INT32 = np.dtype(np.int32)
UINT8 = np.dtype(np.uint8)
TABLE_NAME = re.compile(r"([A-Za-z][A-Za-z0-9]*)_table(?:_\d+)?")  # the function a table holds


def lookup(w, node) -> None:
    """A QLookup: its named function's form where one matches (`circle_ops.lookup`), else the
    table form (per-tensor 8-bit tables only; others raise `Unsupported`)."""
    if ops.named_function(node) is not None:
        ops.lookup(w, node)
        return
    x, table = node.inputs
    out = node.output
    codes = table.numpy()
    per_tensor = all(q is not None and q.axis is None for q in (x.quant, out.quant))
    if not per_tensor or x.dtype not in EIGHT_BIT or out.dtype not in EIGHT_BIT:
        raise ops.Unsupported
    if codes.shape != (256,) or codes.dtype != out.dtype:
        raise ops.Unsupported
    perm = w.home_of(x)
    shape = tuple(x.shape) if perm is None else tuple(x.shape[p] for p in perm)
    source = w.get(x, perm)
    if x.dtype == np.int8:
        unsigned = w.new_tensor(f"{out.name}_codes", UINT8, shape, quant=_unsigned(x.quant))
        w.op("QUANTIZE", [source], [unsigned])
        source = unsigned
    own = w.new_tensor(f"{out.name}_index_codes", UINT8, shape, quant=w.tensors[source].quant)
    size = w.constant(np.asarray(shape, np.int32), f"{out.name}_index_shape")
    w.op("RESHAPE", [source, size], [own])
    index = w.new_tensor(f"{out.name}_index", INT32, shape)
    w.op("CAST", [own], [index], in_data_type=TYPE_CODES[UINT8], out_data_type=TYPE_CODES[INT32])
    function = node.attrs.get("function")
    name = f"{function}_table" if isinstance(function, str) and function in OPS else "table"
    if out.dtype == np.uint8:
        values = w.constant(codes, name, out.quant)
        w.op("GATHER", [values, index], [w.define(out, perm)], axis=0, batch_dims=0)
        return
    unsigned_params = _unsigned(out.quant)  # onert's GATHER takes no int8 table
    values = w.constant((codes.astype(np.int16) + 128).astype(UINT8), name, unsigned_params)
    gathered = w.new_tensor(f"{out.name}_unsigned", UINT8, shape, quant=unsigned_params)
    w.op("GATHER", [values, index], [gathered], axis=0, batch_dims=0)
    w.op("QUANTIZE", [gathered], [w.define(out, perm)])


def _unsigned(quant: QuantParams) -> QuantParams:
    """int8 parameters as uint8 ones holding each code + 128 (the same reals)."""
    return QuantParams(quant.scale, (quant.zero_point[0] + 128,))


# -- reading -------------------------------------------------------------------------------------
def read_cast(r, inputs, outputs, options) -> None:
    """CAST: the IR's Cast (elementwise, in its input's layout)."""
    t, out = r.info(inputs[0]), r.info(outputs[0])
    if out.shape != t.shape:
        raise Malformed("the output must have the input's shape")
    perm = r.perm_of(inputs[0])
    value = r.graph.make_node(
        "Cast", [r.value(inputs[0], perm)], {"to": out.dtype.name}, f"{out.name}/op"
    ).output
    r.define(outputs[0], value, perm)


def read_gather(r, inputs, outputs, options) -> None:
    """GATHER: the QLookup the writer spells this way (`lookup`), else the IR's Gather."""
    axis = options.scalar(0, "i", 0) if options is not None else 0
    batch_dims = options.scalar(1, "i", 0) if options is not None else 0
    if batch_dims:
        raise Malformed("batch_dims other than 0 is not supported")
    if _table_lookup(r, inputs, outputs, axis):
        return
    params = r.info(inputs[0])
    attrs = {"axis": axis % max(len(params.shape), 1)}
    values = [r.value(i) for i in inputs[:2]]
    out = r.info(outputs[0])
    value = r.graph.make_node("Gather", values, attrs, f"{out.name}/op").output
    r.define(outputs[0], value)


def _table_lookup(r, inputs, outputs, axis: int) -> bool:
    """Define the GATHER's output as QLookup(x, table) when it gathers a constant 256-entry
    8-bit table along axis 0 by int32 indices that are x - min(dtype) for per-tensor quantized
    8-bit codes x of the output's shape; False (nothing defined) otherwise."""
    table, out = r.const(inputs[0]), r.info(outputs[0])
    if table is None or table.shape != (256,) or table.dtype not in EIGHT_BIT:
        return False
    if axis not in (0, -1) or out.dtype != table.dtype or not _per_tensor(out.quant):
        return False
    source = _codes_source(r, inputs[1])
    if source is None or r.info(source).shape != out.shape:
        return False
    perm = r.perm_of(source)
    x = r.value(source, perm)
    found = TABLE_NAME.fullmatch(r.info(inputs[0]).name)
    attrs = {"function": found[1]} if found and found[1] in OPS else {}
    constant = r.graph.add_constant(table.copy(), r.info(inputs[0]).name)
    value = r.graph.make_node("QLookup", [x, constant], attrs, f"{out.name}/op").output
    value.quant = out.quant
    r.define(outputs[0], value, perm)
    r.tables[outputs[0]] = (value.producer, perm)
    return True


def read_quantize(r, inputs, outputs, options) -> None:
    """QUANTIZE: a uint8 table lookup (`_table_lookup`) requantized to int8 at its scale, as
    QUANTIZE or DEQUANTIZE, QUANTIZE (the writer's int8 tables), as one int8 QLookup; else as
    `circle_read_ops.quantize_op` reads it."""
    source = inputs[0]
    dequantize = r.producers.get(source)
    if r.info(source).dtype == np.float32 and dequantize and dequantize[0] == "DEQUANTIZE":
        source = dequantize[1][0]
    out = r.info(outputs[0])
    if source in r.tables and out.dtype == np.int8 and _per_tensor(out.quant):
        node, perm = r.tables[source]
        if _unsigned(out.quant) == node.output.quant:
            codes = (node.inputs[1].numpy().astype(np.int16) - 128).astype(np.int8)
            table = r.graph.add_constant(codes, node.inputs[1].name)
            value = r.graph.make_node(
                "QLookup", [node.inputs[0], table], dict(node.attrs), f"{out.name}/op"
            ).output
            value.quant = out.quant
            r.define(outputs[0], value, perm)
            return
    quantize_op(r, inputs, outputs, options, code="QUANTIZE")


def _codes_source(r, index: int) -> int | None:
    """The tensor of 8-bit codes x whose index x - min(dtype) tensor `index` is, in the
    writer's forms: CAST to int32 of (RESHAPE to the same shape of) uint8 codes, which are x
    itself or int8 codes x requantized at their scale with the zero point moved by 128."""
    cast = r.producers.get(index)
    t = r.info(index)
    if cast is None or cast[0] != "CAST" or t.dtype != INT32:
        return None
    codes = cast[1][0]
    if r.info(codes).shape != t.shape:
        return None
    reshape = r.producers.get(codes)
    if reshape is not None and reshape[0] == "RESHAPE" and r.info(reshape[1][0]).shape == t.shape:
        codes = reshape[1][0]
    unsigned = r.info(codes)
    if unsigned.dtype != UINT8 or not _per_tensor(unsigned.quant):
        return None
    quantize = r.producers.get(codes)
    if quantize is None or quantize[0] != "QUANTIZE":
        return codes
    before = quantize[1][0]
    dequantize = r.producers.get(before)
    if r.info(before).dtype == np.float32 and dequantize and dequantize[0] == "DEQUANTIZE":
        before = dequantize[1][0]
    signed = r.info(before)
    if signed.dtype != np.int8 or not _per_tensor(signed.quant):
        return codes  # a QUANTIZE from float: its uint8 codes index the table as they are
    same_scale = signed.quant.scale == unsigned.quant.scale
    shifted = unsigned.quant.zero_point[0] == signed.quant.zero_point[0] + 128
    return before if same_scale and shifted and signed.shape == t.shape else codes


def _per_tensor(quant) -> bool:
    return quant is not None and quant.axis is None and len(quant.scale) == 1
