"""Quantized sequence MatMuls run their samples together: the PP-OCR recognizer (13 MatMuls
quantized as Reshape -> QGemm -> Reshape on the rows) on its real text-line samples.

Reads a build folder of `bench/partition_real.py --model ocr_rec --keep FOLDER` (the optimized
float model, its calibration statistics and samples), then reports as JSON:

- whether the quantized model runs samples in batches (else the nodes that keep it from it),
  and whether its batched outputs equal one-sample runs bit for bit (every output, `--samples`
  samples);
- the quantize step's work (quantize the float model, then compare it with the float model on
  the 8 calibration samples the step checks) and an evaluation of `--samples` samples, timed
  batched and one sample at a time: the same code with the rows rule of `batching.batch_plan`
  switched off, as before it existed (a quantized graph with a rows value did not batch).
  Wall seconds, the minimum of `--repeat` alternating runs.

Usage: python bench/rows_batching.py FOLDER [--samples 32] [--repeat 3]
"""

import argparse
import json
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from onebuild import compile as api
from onebuild.graph_ir import interpreter
from onebuild.graph_ir.batching import batch_plan, keeps_rows, separable
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.quant.evaluate import compare_graphs
from onebuild.graph_ir.serde import load_ir
from onebuild.graph_ir.serde.calibration_file import load_calibration
from onebuild.npz import read_npz

CHECKED = 8  # the quantize step's accuracy check (tasks/quantize.py CHECK_SAMPLES)


def old_plan(graph):
    """`batch_plan` as it was: every value's leading dim 1, or no batching."""
    values = [v for n in graph.nodes for v in n.outputs]
    if not all(v.shape and v.shape[0] == 1 for v in values):
        return None
    return batch_plan(graph)


@contextmanager
def rows_rule(on: bool):
    if on:
        yield
        return
    interpreter.batch_plan = old_plan
    try:
        yield
    finally:
        interpreter.batch_plan = batch_plan


def quantize_step(path: Path, stats, samples: dict) -> float:
    """Seconds to quantize the float model in `path` (default options, uint8) and compare it
    with the float model on the checked samples."""
    model, float_graph = load_ir(path), load_ir(path).main
    start = time.perf_counter()
    model = api.quantize(model, api.QuantizeOptions(dtype="uint8"), stats)
    compare_graphs(float_graph, model.main, [("samples", samples)])
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    build = args.folder / "build" / "layout"
    float_model = load_ir(build / "optimize.obir")
    quantized = load_ir(build / "quantize.obir").main
    stats = load_calibration(build / "calibrate.npz")
    data = read_npz(args.folder / "calibration.npz")
    name = next(iter(data))
    many = np.concatenate([data[name]] * -(-args.samples // len(data[name])))[: args.samples]
    feeds = {name: many}
    checked = {name: data[name][:CHECKED]}

    integer = Interpreter(quantized)  # float in and out: the quantize step's model I/O
    batched = integer.run_batch(feeds)
    equal = all(
        np.array_equal(batched[v.name][i], integer.run({name: many[i]})[v.name])
        for i in range(args.samples)
        for v in quantized.outputs
    )
    times = {"batched": [], "one_at_a_time": []}
    steps = {"batched": [], "one_at_a_time": []}
    for _ in range(args.repeat):
        for key, on in (("batched", True), ("one_at_a_time", False)):
            with rows_rule(on):
                start = time.perf_counter()
                compare_graphs(float_model.main, quantized, [("samples", feeds)])
                times[key].append(time.perf_counter() - start)
                steps[key].append(quantize_step(build / "optimize.obir", stats, checked))
    rows = sum(n.op == "QGemm" and n.inputs[0].shape[0] > 1 for n in quantized.nodes)
    blocking = [
        f"{n.name} ({n.op})" for n in quantized.nodes if not (separable(n) and keeps_rows(n))
    ]
    print(
        json.dumps(
            {
                "model": "ocr_rec",
                "rows_qgemms": rows,
                "batchable": integer.batchable,
                "kept_from_batching_by": blocking,
                "batched_equals_single_runs": equal,
                "samples": args.samples,
                "evaluation_seconds": {k: round(min(v), 2) for k, v in times.items()},
                "quantize_step_seconds": {k: round(min(v), 2) for k, v in steps.items()},
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
