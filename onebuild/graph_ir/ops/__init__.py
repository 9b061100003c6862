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
    recurrent,
    reduce,
    resize,
    tensor_ops,
)
from .registry import OPS, OpDef, TensorType, broadcast_shape, normalize_axis

__all__ = ["OPS", "OpDef", "TensorType", "broadcast_shape", "normalize_axis"]
