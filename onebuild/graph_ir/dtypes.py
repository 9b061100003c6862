"""Element types of the IR, by canonical name.

numpy has no bfloat16, float8, float4 or sub-byte integers; `ml_dtypes` (the library numpy-based
frameworks share for them) supplies those, so the IR can carry every ONNX tensor type losslessly.
"""

import ml_dtypes
import numpy as np

DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "float64": np.dtype(np.float64),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "int8": np.dtype(np.int8),
    "int16": np.dtype(np.int16),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
    "uint8": np.dtype(np.uint8),
    "uint16": np.dtype(np.uint16),
    "uint32": np.dtype(np.uint32),
    "uint64": np.dtype(np.uint64),
    "bool": np.dtype(np.bool_),
    "float8e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "float8e4m3fnuz": np.dtype(ml_dtypes.float8_e4m3fnuz),
    "float8e5m2": np.dtype(ml_dtypes.float8_e5m2),
    "float8e5m2fnuz": np.dtype(ml_dtypes.float8_e5m2fnuz),
    "float8e8m0": np.dtype(ml_dtypes.float8_e8m0fnu),
    "float4e2m1": np.dtype(ml_dtypes.float4_e2m1fn),
    "int4": np.dtype(ml_dtypes.int4),
    "uint4": np.dtype(ml_dtypes.uint4),
    "int2": np.dtype(ml_dtypes.int2),
    "uint2": np.dtype(ml_dtypes.uint2),
}

_NAMES = {dt: name for name, dt in DTYPES.items()}


def dtype(name: str) -> np.dtype:
    """The numpy dtype of a canonical IR type name."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown element type '{name}'") from None


def name_of(dt: np.dtype | type) -> str:
    """The canonical IR name of a numpy dtype."""
    try:
        return _NAMES[np.dtype(dt)]
    except KeyError:
        raise ValueError(f"unsupported element type {np.dtype(dt)}") from None
