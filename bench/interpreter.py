"""Interpreter speed vs onnxruntime, and import memory for a large model. Prints JSON.

Speed: ms per inference (median of repeated runs, same inputs, same process) of onebuild's
reference interpreter (after O1) and of onnxruntime (default CPU session), on the light ResNet50
and SqueezeNet graphs with seeded random weights, and their ratio.
Memory: vgg19 (143.7 M float32 parameters, 575 MB) is saved as an ONNX file, once with external
data (the layout large models ship in) and once embedded, then loaded with `load_onnx` (weights
are memory-mapped either way) and run in a fresh subprocess; peak RSS is compared with the
weight bytes.
"""

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort

from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.passes import run_preset
from onebuild.graph_ir.serde import load_onnx
from onebuild.graph_ir.serde.model_zoo import light_model
from onebuild.graph_ir.serde.onnx_import import import_onnx


def median_ms(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def speed(name: str, repeats: int) -> dict:
    proto = light_model(name, seed=0)
    model = import_onnx(proto, name)
    run_preset(model)
    graph = model.main
    rng = np.random.default_rng(0)
    feeds = {v.name: rng.random(v.shape, dtype=np.float32) for v in graph.inputs}
    interpreter = Interpreter(graph)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(proto.SerializeToString(), options)
    options.intra_op_num_threads = 1
    single = ort.InferenceSession(proto.SerializeToString(), options)
    ours = median_ms(lambda: interpreter.run(feeds), repeats)
    theirs = median_ms(lambda: session.run(None, feeds), repeats)
    theirs_single = median_ms(lambda: single.run(None, feeds), repeats)
    return {
        "onebuild_ms": round(ours, 2),
        "onnxruntime_ms": round(theirs, 2),
        "ratio": round(ours / theirs, 3),
        "onnxruntime_1thread_ms": round(theirs_single, 2),
        "ratio_vs_1thread": round(ours / theirs_single, 3),
    }


def _peak_rss_bytes() -> int:
    """This process's RSS high-water mark (VmHWM: reset by exec, unlike ru_maxrss)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _import_child(path: str) -> None:
    """Runs in a subprocess: import + one inference, then report times and peak RSS."""
    start = time.perf_counter()
    model = load_onnx(path)
    imported = time.perf_counter() - start
    graph = model.main
    feeds = {v.name: np.zeros(v.shape, np.float32) for v in graph.inputs}
    start = time.perf_counter()
    Interpreter(graph).run(feeds)
    ran = time.perf_counter() - start
    peak = _peak_rss_bytes()
    print(json.dumps({"import_s": imported, "run_s": ran, "peak_rss_bytes": peak}))


def vgg19_memory(external: bool) -> dict:
    proto = light_model("vgg19", seed=0)
    weight_bytes = sum(int(np.prod(t.dims)) * 4 for t in proto.graph.initializer)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "vgg19.onnx")
        if external:
            onnx.save(proto, path, save_as_external_data=True, location="vgg19.weights")
        else:
            onnx.save(proto, path)
        del proto
        result = subprocess.run(
            [sys.executable, __file__, "--child", path], capture_output=True, text=True, check=True
        )
    child = json.loads(result.stdout)
    return {
        "weight_mb": round(weight_bytes / 1e6, 1),
        "import_s": round(child["import_s"], 3),
        "run_s": round(child["run_s"], 3),
        "peak_rss_mb": round(child["peak_rss_bytes"] / 1e6, 1),
        "peak_rss_over_weights": round(child["peak_rss_bytes"] / weight_bytes, 3),
    }


def main() -> None:
    repeats = int(os.environ.get("BENCH_REPEATS", "10"))
    report = {
        "threads": {"numpy_blas": "default", "onnxruntime": "default"},
        "resnet50": speed("resnet50", repeats),
        "squeezenet": speed("squeezenet", repeats),
        "vgg19_import_external_data": vgg19_memory(external=True),
        "vgg19_import_embedded": vgg19_memory(external=False),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        _import_child(sys.argv[2])
    else:
        main()
