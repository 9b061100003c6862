"""IR operators. Importing this package registers every kernel."""

from . import (  # noqa: F401
    control,
    conv,
    elementwise,
    indexing,
    normalization,
    pool,
    quantized,
    quantized_dynamic,
    quantized_recurrent,
    quantized_softmax,
    recurrent,
    reduce,
    resize,
    tensor_ops,
)
from .registry import OPS, OpDef, TensorType, broadcast_shape, normalize_axis, weight_axes

__all__ = ["OPS", "OpDef", "TensorType", "broadcast_shape", "normalize_axis", "weight_axes"]
