"""Real architectures (onnx's light graphs, seeded random weights) against onnxruntime,
before and after O1; the O1 preset is idempotent."""

import numpy as np
import onnxruntime as ort
import pytest

from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.passes import run_preset
from onebuild.graph_ir.serde.model_zoo import LIGHT_MODELS, light_model
from onebuild.graph_ir.serde.onnx_import import import_onnx
from onebuild.graph_ir.verify import verify

RTOL, ATOL = 1e-3, 1e-4


def onnxruntime_outputs(proto, feeds):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(proto.SerializeToString(), options)
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_matches_onnxruntime_before_and_after_o1(name):
    proto = light_model(name, seed=0, expose_logits=True)
    model = import_onnx(proto, name)
    graph = model.main
    verify(graph)
    rng = np.random.default_rng(7)
    feeds = {v.name: rng.random(v.shape, dtype=np.float32) for v in graph.inputs}
    expected = onnxruntime_outputs(proto, feeds)
    assert expected.keys() == {v.name for v in graph.outputs}

    before = Interpreter(graph).run(feeds)
    for key, want in expected.items():
        np.testing.assert_allclose(before[key], want, rtol=RTOL, atol=ATOL, err_msg=key)

    nodes = len(graph.nodes)
    records = run_preset(model, "O1")
    assert any(r.modified for r in records) and len(graph.nodes) < nodes
    assert "Dropout" not in {n.op for n in graph.nodes}
    for node in graph.nodes:  # what remains of BN and Relu has no Conv/Gemm to fold into
        if node.op in ("BatchNormalization", "Relu"):
            assert node.inputs[0].producer.op not in ("Conv", "Gemm"), node
    after = Interpreter(graph).run(feeds)
    for key, want in expected.items():
        np.testing.assert_allclose(after[key], want, rtol=RTOL, atol=ATOL, err_msg=key)

    second = run_preset(model, "O1")
    assert not any(r.modified for r in second), "O1 is not idempotent"
