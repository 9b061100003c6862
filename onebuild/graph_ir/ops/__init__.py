"""IR operators. Importing this package registers every kernel."""

from . import conv, elementwise, normalization, pool, reduce, resize, tensor_ops  # noqa: F401
from .registry import OPS, OpDef, TensorType, broadcast_shape, normalize_axis

__all__ = ["OPS", "OpDef", "TensorType", "broadcast_shape", "normalize_axis"]
