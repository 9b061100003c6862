"""Small ONNX models for tests, built with onnx.helper."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def make_model(nodes, inputs, outputs, initializers=(), opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "test",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        [numpy_helper.from_array(np.asarray(a), name) for name, a in initializers],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8  # readable by every onnxruntime the tests may meet
    return model


def conv_bn_relu_model(rng, dynamic_batch=False, opset=17) -> onnx.ModelProto:
    """Conv -> BN -> Relu -> Dropout -> Shape-computed Reshape -> Gemm -> Clip(0, 6)."""
    batch = "N" if dynamic_batch else 1
    w = rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32)
    b = rng.normal(0, 0.1, 4).astype(np.float32)
    bn = [
        rng.uniform(0.5, 1.5, 4),
        rng.normal(0, 0.1, 4),
        rng.normal(0, 0.1, 4),
        rng.uniform(0.5, 1.5, 4),
    ]
    fc = rng.normal(0, 0.1, (10, 4 * 8 * 8)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["n"], name="bn"),
        helper.make_node("Relu", ["n"], ["r"], name="relu"),
        helper.make_node("Dropout", ["r"], ["d"], name="drop"),
        helper.make_node("Shape", ["d"], ["shp"], name="shape"),
        helper.make_node("Gather", ["shp", "zero"], ["n0"], axis=0, name="gather"),
        helper.make_node("Unsqueeze", ["n0", "axes0"], ["n0u"], name="unsq")
        if opset >= 13
        else helper.make_node("Unsqueeze", ["n0"], ["n0u"], axes=[0], name="unsq"),
        helper.make_node("Concat", ["n0u", "minus1"], ["newshape"], axis=0, name="concat"),
        helper.make_node("Reshape", ["d", "newshape"], ["flat"], name="reshape"),
        helper.make_node("Gemm", ["flat", "fc"], ["g"], transB=1, name="fc"),
        helper.make_node("Clip", ["g", "lo", "hi"], ["y"], name="relu6")
        if opset >= 11
        else helper.make_node("Clip", ["g"], ["y"], min=0.0, max=6.0, name="relu6"),
    ]
    inits = [
        ("w", w),
        ("b", b),
        ("s", bn[0].astype(np.float32)),
        ("bb", bn[1].astype(np.float32)),
        ("m", bn[2].astype(np.float32)),
        ("v", bn[3].astype(np.float32)),
        ("fc", fc),
        ("zero", np.array(0, np.int64)),
        ("axes0", np.array([0], np.int64)),
        ("minus1", np.array([-1], np.int64)),
        ("lo", np.array(0, np.float32)),
        ("hi", np.array(6, np.float32)),
    ]
    return make_model(nodes, [("x", [batch, 3, 8, 8])], ["y"], inits, opset=opset)
