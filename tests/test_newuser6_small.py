"""A new user's small findings (onert user and Python scripter): Session I/O types, integer
data fed to a float input, DUMP_MINMAX on a compiled session, bounded one-line errors, numpy
warnings of constant folding."""

import logging
import warnings

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from onebuild import Session
from onebuild.errors import UnsupportedOpsError
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.serde import load_onnx


def test_unsupported_operator_errors_name_a_few_nodes_per_kind():
    """189 unsupported nodes made a 15 KB line; now each kind with its count and first nodes."""
    listed = [("QLSTM", f"encoder/layer{i}/lstm") for i in range(180)]
    listed += [("Einsum", "head/einsum", "If 'c'.then_branch")]
    message = str(UnsupportedOpsError("enc.obir", listed))
    assert len(message) < 300
    assert "181 node(s) use unsupported operators Einsum, QLSTM" in message
    assert "Einsum (node 'head/einsum' in If 'c'.then_branch)" in message
    assert "QLSTM x180 (nodes 'encoder/layer0/lstm', 'encoder/layer1/lstm'" in message
    assert "and 177 more)" in message


def relative_buckets_model(path):
    """T5's relative-position buckets: log of a range starting at 0 (log(0) = -inf, then cast
    to an integer), discarded by a Where for small distances; all folded at import."""
    distance = np.arange(8, dtype=np.float32)
    nodes = [
        helper.make_node("Log", ["d"], ["log"]),
        helper.make_node("Cast", ["log"], ["li"], to=TensorProto.INT64),
        helper.make_node("Less", ["d", "two"], ["small"]),
        helper.make_node("Cast", ["d"], ["di"], to=TensorProto.INT64),
        helper.make_node("Where", ["small", "di", "li"], ["bucket"]),
        helper.make_node("Cast", ["bucket"], ["bf"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["x", "bf"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "t5",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        [
            numpy_helper.from_array(distance, "d"),
            numpy_helper.from_array(np.float32(2), "two"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())


def test_constant_folding_of_log_zero_is_silent_and_right(tmp_path):
    path = tmp_path / "t5.onnx"
    relative_buckets_model(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a numpy RuntimeWarning fails the import
        model = load_onnx(path)
    assert [n.op for n in model.main.nodes] == ["Add"]
    x = np.zeros((1, 8), np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(Interpreter(model.main).run({"x": x})["y"], want[0])


def embedding_model(path):
    """int64 token ids -> Gather from a float table -> Relu."""
    table = np.linspace(-1, 1, 40, dtype=np.float32).reshape(10, 4)
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["e"], axis=0),
        helper.make_node("Relu", ["e"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "embed",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 4])],
        [numpy_helper.from_array(table, "table")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())


def test_session_io_types_beside_the_shapes(tmp_path):
    embedding_model(tmp_path / "embed.onnx")
    with Session(tmp_path / "embed.onnx", workspace=False) as session:
        assert session.inputs == {"ids": (1, 3)}  # shapes, as before
        assert session.input_types == {"ids": "int64"}
        assert session.output_types == {"y": "float32"}
        out = session.run({"ids": np.array([[1, 2, 9]])})["y"]
        assert out.dtype == np.dtype(session.output_types["y"])


def test_integer_data_into_a_float_input_warns_once(tmp_path, caplog):
    from digits_session import DIGITS, SHAPES, digits_data

    pixels = (digits_data("test")[:2] * 255).astype(np.uint8)
    with Session(DIGITS / "digits.onnx", workspace=False, input_shapes=SHAPES) as session:
        with caplog.at_level(logging.WARNING, "onebuild"):
            for image in pixels:
                session.run({"input": image})
        lines = [r.getMessage() for r in caplog.records if "float32 but was given" in r.message]
        assert lines == [
            "input 'input' is float32 but was given uint8 data: its values are used as they "
            "are (0..255 stays 0..255, not scaled); convert it as the model expects "
            "(x / 255, say)"
        ]
        caplog.clear()
        session.run({"input": digits_data("test")[0]})  # float data: nothing said
        assert not caplog.records


def test_codegen_error_puts_the_remedy_first_and_dump_minmax_says_it_records_nothing(
    tmp_path, caplog
):
    """The face landmark stem's float input goes through a Transpose and a QuantizeLinear on
    the CPU, so a whole-model binary is impossible; recording after quantize() records
    nothing, and now says so."""
    from test_quantized_prelu import STEM, photos

    session = Session(STEM, workspace=tmp_path / "ws")
    session.set_execute_config("DUMP_MINMAX")
    for image in photos(1):
        session.run({"input_1": image})
    session.quantize()
    session.set_codegen_model_path(tmp_path / "stem.tvn")
    try:
        session.codegen("trix_sim")
    except Exception as error:
        message = str(error)
    assert message.startswith("compile without set_codegen_model_path to partition the model")
    assert "QuantizeLinear" in message
    with caplog.at_level(logging.WARNING, "onebuild"):
        session.set_execute_config("DUMP_MINMAX")
    assert "runs its quantized model, so runs record nothing (2 float runs" in caplog.text
    session.close()
