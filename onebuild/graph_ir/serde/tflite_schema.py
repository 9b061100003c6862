"""The parts of the TFLite schema (`schema.fbs`) and of its circle extension
(`circle_schema.fbs` 0.8, which keeps TFLite's tables and numbering and adds codes below zero and
options from 250 up) that onebuild reads and writes: field slots, enums, operator codes.

Slots are field positions in declaration order; a union takes two (its type, then its value).
"""

import numpy as np

IDENTIFIER = {"circle": b"CIR0", "tflite": b"TFL3"}
SCHEMA_VERSION = {"circle": 0, "tflite": 3}

# table fields --------------------------------------------------------------------------------
MODEL_VERSION, MODEL_OPCODES, MODEL_SUBGRAPHS, MODEL_DESCRIPTION, MODEL_BUFFERS = range(5)
MODEL_METADATA = 6  # [Metadata]: (name, buffer index); slot 5 is the deprecated metadata_buffer
METADATA_NAME, METADATA_BUFFER = range(2)
# onebuild's metadata entry: every quantized tensor's scales as float64, in tensor order (the
# schema's scales are float32; the IR's are float64, and requantization depends on them)
EXACT_SCALES = "onebuild.scales_f64"
SUBGRAPH_TENSORS, SUBGRAPH_INPUTS, SUBGRAPH_OUTPUTS, SUBGRAPH_OPERATORS, SUBGRAPH_NAME = range(5)
TENSOR_SHAPE, TENSOR_TYPE, TENSOR_BUFFER, TENSOR_NAME, TENSOR_QUANT = range(5)
TENSOR_SPARSITY = 6
QUANT_MIN, QUANT_MAX, QUANT_SCALE, QUANT_ZERO_POINT, QUANT_DETAILS_TYPE = range(5)
QUANT_DIMENSION = 6
OPCODE_DEPRECATED, OPCODE_CUSTOM, OPCODE_VERSION, OPCODE_BUILTIN = range(4)
OP_OPCODE, OP_INPUTS, OP_OUTPUTS, OP_OPTIONS_TYPE, OP_OPTIONS = range(5)
BUFFER_DATA, BUFFER_OFFSET, BUFFER_SIZE = range(3)
PLACEHOLDER_FOR_GREATER_OP_CODES = 127

# element types -------------------------------------------------------------------------------
TENSOR_TYPES: dict[int, np.dtype] = {
    0: np.dtype(np.float32),
    1: np.dtype(np.float16),
    2: np.dtype(np.int32),
    3: np.dtype(np.uint8),
    4: np.dtype(np.int64),
    6: np.dtype(np.bool_),
    7: np.dtype(np.int16),
    9: np.dtype(np.int8),
    10: np.dtype(np.float64),
    12: np.dtype(np.uint64),
    15: np.dtype(np.uint32),
    16: np.dtype(np.uint16),
}
TYPE_CODES = {dt: code for code, dt in TENSOR_TYPES.items()}

# enums ---------------------------------------------------------------------------------------
SAME, VALID = 0, 1
ACT_NONE, ACT_RELU, ACT_RELU_N1_TO_1, ACT_RELU6 = 0, 1, 2, 3
ACTIVATION_BOUNDS = {  # fused activation -> (lo, hi) of the real output
    ACT_NONE: (-np.inf, np.inf),
    ACT_RELU: (0.0, np.inf),
    ACT_RELU_N1_TO_1: (-1.0, 1.0),
    ACT_RELU6: (0.0, 6.0),
}

# builtin operators ---------------------------------------------------------------------------
BUILTIN = {
    "ADD": 0,
    "AVERAGE_POOL_2D": 1,
    "CONCATENATION": 2,
    "CONV_2D": 3,
    "DEPTHWISE_CONV_2D": 4,
    "DEPTH_TO_SPACE": 5,
    "DEQUANTIZE": 6,
    "FULLY_CONNECTED": 9,
    "LOCAL_RESPONSE_NORMALIZATION": 13,
    "LOGISTIC": 14,
    "MAX_POOL_2D": 17,
    "MUL": 18,
    "RELU": 19,
    "RELU_N1_TO_1": 20,
    "RELU6": 21,
    "RESHAPE": 22,
    "RESIZE_BILINEAR": 23,
    "SOFTMAX": 25,
    "TANH": 28,
    "PAD": 34,
    "TRANSPOSE": 39,
    "MEAN": 40,
    "SUB": 41,
    "DIV": 42,
    "EXP": 47,
    "SPLIT": 49,
    "MAXIMUM": 55,
    "MINIMUM": 57,
    "PADV2": 60,
    "SQRT": 75,
    "POW": 78,
    "REDUCE_MAX": 82,
    "RESIZE_NEAREST_NEIGHBOR": 97,
    "LEAKY_RELU": 98,
    "MIRROR_PAD": 100,
    "SPLIT_V": 102,
    "QUANTIZE": 114,
    "HARD_SWISH": 117,
    "BATCH_MATMUL": 126,
    "TRANSPOSE_CONV": 67,
    "GELU": 150,
    "PRELU": 54,
    "GATHER": 36,
    "CAST": 53,
    "SLICE": 65,
    "STRIDED_SLICE": 45,
    "DENSIFY": 124,
}
BUILTIN_NAMES = {code: name for name, code in BUILTIN.items()}

# Every builtin operator's name by code (TFLite schema.fbs 2.x, codes 0 to 209; circle's below
# zero), so messages name an operator onebuild does not read instead of numbering it.
OPERATOR_NAMES = dict(
    enumerate(
        """
ADD AVERAGE_POOL_2D CONCATENATION CONV_2D DEPTHWISE_CONV_2D DEPTH_TO_SPACE DEQUANTIZE
EMBEDDING_LOOKUP FLOOR FULLY_CONNECTED HASHTABLE_LOOKUP L2_NORMALIZATION L2_POOL_2D
LOCAL_RESPONSE_NORMALIZATION LOGISTIC LSH_PROJECTION LSTM MAX_POOL_2D MUL RELU RELU_N1_TO_1
RELU6 RESHAPE RESIZE_BILINEAR RNN SOFTMAX SPACE_TO_DEPTH SVDF TANH CONCAT_EMBEDDINGS SKIP_GRAM
CALL CUSTOM EMBEDDING_LOOKUP_SPARSE PAD UNIDIRECTIONAL_SEQUENCE_RNN GATHER BATCH_TO_SPACE_ND
SPACE_TO_BATCH_ND TRANSPOSE MEAN SUB DIV SQUEEZE UNIDIRECTIONAL_SEQUENCE_LSTM STRIDED_SLICE
BIDIRECTIONAL_SEQUENCE_RNN EXP TOPK_V2 SPLIT LOG_SOFTMAX DELEGATE BIDIRECTIONAL_SEQUENCE_LSTM
CAST PRELU MAXIMUM ARG_MAX MINIMUM LESS NEG PADV2 GREATER GREATER_EQUAL LESS_EQUAL SELECT
SLICE SIN TRANSPOSE_CONV SPARSE_TO_DENSE TILE EXPAND_DIMS EQUAL NOT_EQUAL LOG SUM SQRT RSQRT
SHAPE POW ARG_MIN FAKE_QUANT REDUCE_PROD REDUCE_MAX PACK LOGICAL_OR ONE_HOT LOGICAL_AND
LOGICAL_NOT UNPACK REDUCE_MIN FLOOR_DIV REDUCE_ANY SQUARE ZEROS_LIKE FILL FLOOR_MOD RANGE
RESIZE_NEAREST_NEIGHBOR LEAKY_RELU SQUARED_DIFFERENCE MIRROR_PAD ABS SPLIT_V UNIQUE CEIL
REVERSE_V2 ADD_N GATHER_ND COS WHERE RANK ELU REVERSE_SEQUENCE MATRIX_DIAG QUANTIZE
MATRIX_SET_DIAG ROUND HARD_SWISH IF WHILE NON_MAX_SUPPRESSION_V4 NON_MAX_SUPPRESSION_V5
SCATTER_ND SELECT_V2 DENSIFY SEGMENT_SUM BATCH_MATMUL PLACEHOLDER_FOR_GREATER_OP_CODES CUMSUM
CALL_ONCE BROADCAST_TO RFFT2D CONV_3D IMAG REAL COMPLEX_ABS HASHTABLE HASHTABLE_FIND
HASHTABLE_IMPORT HASHTABLE_SIZE REDUCE_ALL CONV_3D_TRANSPOSE VAR_HANDLE READ_VARIABLE
ASSIGN_VARIABLE BROADCAST_ARGS RANDOM_STANDARD_NORMAL BUCKETIZE RANDOM_UNIFORM MULTINOMIAL
GELU DYNAMIC_UPDATE_SLICE RELU_0_TO_1 UNSORTED_SEGMENT_PROD UNSORTED_SEGMENT_MAX
UNSORTED_SEGMENT_SUM ATAN2 UNSORTED_SEGMENT_MIN SIGN BITCAST BITWISE_XOR RIGHT_SHIFT
STABLEHLO_LOGISTIC STABLEHLO_ADD STABLEHLO_DIVIDE STABLEHLO_MULTIPLY STABLEHLO_MAXIMUM
STABLEHLO_RESHAPE STABLEHLO_CLAMP STABLEHLO_CONCATENATE STABLEHLO_BROADCAST_IN_DIM
STABLEHLO_CONVOLUTION STABLEHLO_SLICE STABLEHLO_CUSTOM_CALL STABLEHLO_REDUCE STABLEHLO_ABS
STABLEHLO_AND STABLEHLO_COSINE STABLEHLO_EXPONENTIAL STABLEHLO_FLOOR STABLEHLO_LOG
STABLEHLO_MINIMUM STABLEHLO_NEGATE STABLEHLO_OR STABLEHLO_POWER STABLEHLO_REMAINDER
STABLEHLO_RSQRT STABLEHLO_SELECT STABLEHLO_SUBTRACT STABLEHLO_TANH STABLEHLO_SCATTER
STABLEHLO_COMPARE STABLEHLO_CONVERT STABLEHLO_DYNAMIC_SLICE STABLEHLO_DYNAMIC_UPDATE_SLICE
STABLEHLO_PAD STABLEHLO_IOTA STABLEHLO_DOT_GENERAL STABLEHLO_REDUCE_WINDOW STABLEHLO_SORT
STABLEHLO_WHILE STABLEHLO_GATHER STABLEHLO_TRANSPOSE DILATE STABLEHLO_RNG_BIT_GENERATOR
REDUCE_WINDOW STABLEHLO_COMPOSITE STABLEHLO_SHIFT_LEFT STABLEHLO_CBRT STABLEHLO_CASE
""".split()
    )
)
OPERATOR_NAMES.update({-5: "GRU", -4: "BCQ_GATHER", -3: "BCQ_FULLY_CONNECTED", -2: "INSTANCE_NORM"})

# BuiltinOptions union: the options table each operator takes (union type index, and the
# table's fields in slot order with their kinds).
OPTIONS: dict[str, tuple[int, tuple[tuple[str, str], ...]]] = {
    "CONV_2D": (
        1,
        (
            ("padding", "byte"),
            ("stride_w", "int"),
            ("stride_h", "int"),
            ("activation", "byte"),
            ("dilation_w", "int"),
            ("dilation_h", "int"),
        ),
    ),
    "DEPTHWISE_CONV_2D": (
        2,
        (
            ("padding", "byte"),
            ("stride_w", "int"),
            ("stride_h", "int"),
            ("depth_multiplier", "int"),
            ("activation", "byte"),
            ("dilation_w", "int"),
            ("dilation_h", "int"),
        ),
    ),
    "AVERAGE_POOL_2D": (
        5,
        (
            ("padding", "byte"),
            ("stride_w", "int"),
            ("stride_h", "int"),
            ("filter_w", "int"),
            ("filter_h", "int"),
            ("activation", "byte"),
        ),
    ),
    "FULLY_CONNECTED": (
        8,
        (
            ("activation", "byte"),
            ("weights_format", "byte"),
            ("keep_num_dims", "bool"),
        ),
    ),
    "SOFTMAX": (9, (("beta", "float"),)),
    "CONCATENATION": (10, (("axis", "int"), ("activation", "byte"))),
    "ADD": (11, (("activation", "byte"),)),
    "LOCAL_RESPONSE_NORMALIZATION": (
        13,
        (("radius", "int"), ("bias", "float"), ("alpha", "float"), ("beta", "float")),
    ),
    "RESIZE_BILINEAR": (
        15,
        (
            ("new_height", "int"),
            ("new_width", "int"),
            ("align_corners", "bool"),
            ("half_pixel_centers", "bool"),
        ),
    ),
    "RESHAPE": (17, ()),
    "MUL": (21, (("activation", "byte"),)),
    "PAD": (22, ()),
    "TRANSPOSE": (26, ()),
    "MEAN": (27, (("keep_dims", "bool"),)),
    "SUB": (28, (("activation", "byte"),)),
    "DIV": (29, (("activation", "byte"),)),
    "EXP": (33, ()),
    "SPLIT": (35, (("num_splits", "int"),)),
    "SPLIT_V": (79, (("num_splits", "int"),)),
    "DEQUANTIZE": (38, ()),
    "MAXIMUM": (39, ()),
    "PADV2": (43, ()),
    "SLICE": (48, ()),
    "POW": (56, ()),
    "RESIZE_NEAREST_NEIGHBOR": (74, (("align_corners", "bool"), ("half_pixel_centers", "bool"))),
    "LEAKY_RELU": (75, (("alpha", "float"),)),
    "MIRROR_PAD": (77, (("mode", "byte"),)),
    "QUANTIZE": (89, ()),
    "HARD_SWISH": (91, ()),
    "BATCH_MATMUL": (101, (("adj_x", "bool"), ("adj_y", "bool"))),
    "TRANSPOSE_CONV": (
        49,
        (("padding", "byte"), ("stride_w", "int"), ("stride_h", "int"), ("activation", "byte")),
    ),
    "GELU": (116, (("approximate", "bool"),)),
    "DEPTH_TO_SPACE": (94, (("block_size", "int"),)),
    "GATHER": (23, (("axis", "int"), ("batch_dims", "int"))),
    "CAST": (37, (("in_data_type", "byte"), ("out_data_type", "byte"))),
    "STRIDED_SLICE": (
        32,
        (
            ("begin_mask", "int"),
            ("end_mask", "int"),
            ("ellipsis_mask", "int"),
            ("new_axis_mask", "int"),
            ("shrink_axis_mask", "int"),
            ("offset", "bool"),
        ),
    ),
}
OPTIONS["MAX_POOL_2D"] = OPTIONS["AVERAGE_POOL_2D"]
OPTIONS["REDUCE_MAX"] = OPTIONS["MEAN"]
OPTIONS["MINIMUM"] = OPTIONS["MAXIMUM"]


def channels_last_columns(c: int, h: int, w: int) -> np.ndarray:
    """For a [C, H, W] sample flattened channels-last (TFLite's layout): the channels-first
    index of each stored element (column j of the stored flatten holds IR column order[j])."""
    return np.arange(c * h * w).reshape(c, h, w).transpose(1, 2, 0).ravel()
