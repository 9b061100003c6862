"""What the TFLite reader still refuses says why in one line and what to do: TFLite's LSTM and
SVDF (import the ONNX export), a per-channel bias quantized along an axis it does not have (the
converter wrote one in tflite-micro's person_detect.tflite; LiteRT refuses the file too)."""

import re

import numpy as np
import pytest
from tflite_builder import Op, Tensor, build

from onebuild.errors import ModelError, UnsupportedOpsError
from onebuild.graph_ir.serde.circle_read import read_tflite
from onebuild.graph_ir.serde.tflite_schema import BUILTIN


@pytest.mark.parametrize(
    "code,number,hint",
    [
        (
            "UNIDIRECTIONAL_SEQUENCE_LSTM",
            44,
            "TFLite's LSTM is not read yet: import the model's ONNX",
        ),
        ("SVDF", 27, "SVDF is not read yet: import the model's ONNX export"),
    ],
)
def test_unread_operators_say_what_to_do(monkeypatch, code, number, hint):
    monkeypatch.setitem(BUILTIN, code, number)
    x, y = Tensor("x", "float32", (1, 4)), Tensor("y", "float32", (1, 4))
    data = build([x, y], [Op(code, ["x"], ["y"])], ["x"], ["y"])
    with pytest.raises(UnsupportedOpsError, match=re.escape(f"{code} (node 'operator 0'); {hint}")):
        read_tflite(data)


def test_a_bias_quantized_along_an_axis_it_lacks_is_refused_as_litert_does():
    from ai_edge_litert import interpreter as litert

    scales = (np.arange(1, 9) * 1e-3, np.zeros(8), 3)
    tensors = [
        Tensor("x", "int8", (1, 8), (0.1, 0)),
        Tensor("bias", "int32", (8,), data=np.arange(8, dtype=np.int32), scales=scales),
        Tensor("y", "int8", (1, 8), (0.1, 0)),
    ]
    data = build(tensors, [Op("ADD", ["x", "bias"], ["y"])], ["x"], ["y"])
    with pytest.raises(ValueError):  # LiteRT: the quantized dimension is out of range
        litert.Interpreter(model_content=data).allocate_tensors()
    message = (
        "tensor 1 'bias' of shape \\[8\\] has 8 scales for axis 3, which is not an axis of "
        "that length \\(LiteRT refuses this file too"
    )
    with pytest.raises(ModelError, match=message):
        read_tflite(data)
