"""TRIX simulator speed and schedule quality. Prints JSON, one entry per model and preset.

For the light ResNet50 and SqueezeNet graphs (seeded random weights, uint8, calibrated on seeded
uniform images): wall time of one simulated inference vs onnxruntime running the equivalent QDQ
model (same quantized graph exported by onebuild), their ratio, and the scheduled cycles vs the
roofline bound max(MACs / peak, compulsory DRAM bytes / bandwidth). Also the time the model's
MACs take at numpy's float32 GEMM rate (measured here): the floor of any numpy simulator, and
the simulator's time as a multiple of it.

Every time is the minimum of several runs, with BLAS pinned to one thread (threadpoolctl): on a
loaded machine the minimum is the least disturbed run, and a multithreaded GEMM floor would
measure the load rather than the GEMM. The same runs are also timed in the thread's CPU time
(`*_cpu_*` keys): with one thread doing all the work it equals the wall time of an idle
machine, and on a shared one it leaves out the time the thread waited for a core.
`simulator_ms` is a run of a simulator that already ran once (the program's timeline is then
known); `simulator_first_run_ms` builds a simulator and runs it once, as `onebuild run x.tvn`
does per sample. `compiled_kernels`: whether the simulator ran numba's kernels (extra `fast`;
`ONEBUILD_NUMBA=0` measures the numpy path).
"""

import json
import time

import numpy as np
import onnxruntime as ort
from threadpoolctl import threadpool_limits

from onebuild.graph_ir.ir import Model
from onebuild.graph_ir.passes import run_preset
from onebuild.graph_ir.passes.cleanup import eliminate_dead_code
from onebuild.graph_ir.quant.calibrate import calibrate
from onebuild.graph_ir.quant.config import QuantConfig
from onebuild.graph_ir.quant.quantize_graph import quantize_graph
from onebuild.graph_ir.serde.model_zoo import light_model
from onebuild.graph_ir.serde.onnx_export import export_onnx
from onebuild.graph_ir.serde.onnx_import import import_onnx
from onebuild.targets.trix_sim import kernels
from onebuild.targets.trix_sim.codegen import generate
from onebuild.targets.trix_sim.hardware import load_hardware
from onebuild.targets.trix_sim.lower import lower
from onebuild.targets.trix_sim.simulator import Simulator


def best_seconds(fn, repeats: int, *args) -> tuple[float, float]:
    """The fastest of `repeats` calls, after one warm-up call: in wall time and in the
    thread's CPU time."""
    fn(*args)
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.thread_time()
        fn(*args)
        wall.append(time.perf_counter() - start)
        cpu.append(time.thread_time() - start_cpu)
    return min(wall), min(cpu)


def first_run(module, hw, feeds) -> None:
    Simulator(module, hw).run(feeds)


def float32_gemm_macs_per_second() -> tuple[float, float]:
    """numpy's float32 GEMM rate on a typical convolution shape (256 x 2304 @ 2304 x 784), per
    wall and per CPU second: the speed limit of a numpy simulator, whose exact integer GEMMs
    run on float32 BLAS."""
    rng = np.random.default_rng(0)
    a = rng.random((256, 2304), dtype=np.float32)
    b = rng.random((2304, 784), dtype=np.float32)
    macs = a.shape[0] * a.shape[1] * b.shape[1]
    wall, cpu = best_seconds(np.matmul, 10, a, b)
    return macs / wall, macs / cpu


def main() -> None:
    rng = np.random.default_rng(0)
    gemm_rate, gemm_cpu_rate = float32_gemm_macs_per_second()
    results = []
    for name in ("resnet50", "squeezenet"):
        model = import_onnx(light_model(name, seed=1, expose_logits=True))
        run_preset(model)
        graph = model.main
        x = graph.inputs[0]
        ranges = calibrate(graph, {x.name: rng.random((4, *x.shape), dtype=np.float32)}).ranges
        config = QuantConfig("uint8", input_type="uint8", output_type="uint8")
        quantized = quantize_graph(graph, ranges, config)
        quantized.outputs = quantized.outputs[-1:]
        eliminate_dead_code(quantized)
        feeds = {x.name: rng.integers(0, 256, x.shape).astype(np.uint8)}
        options = ort.SessionOptions()
        options.log_severity_level = 3
        proto = export_onnx(Model([quantized])).SerializeToString()
        session = ort.InferenceSession(proto, options, providers=["CPUExecutionProvider"])
        ort_seconds, _ = best_seconds(session.run, 10, None, feeds)
        for preset in ("trix-s", "trix-m"):
            hw = load_hardware(preset)
            module = generate(lower(quantized, hw), hw, "performance")
            first_seconds, _ = best_seconds(first_run, 3, module, hw, feeds)
            simulator = Simulator(module, hw)  # timed over as many runs as the floor
            sim_seconds, sim_cpu_seconds = best_seconds(simulator.run, 10, feeds)
            _, report = simulator.run(feeds)
            summary = report.summary(hw, module)
            results.append(
                {
                    "model": name,
                    "hardware": preset,
                    "simulator_ms": round(sim_seconds * 1e3, 1),
                    "onnxruntime_qdq_ms": round(ort_seconds * 1e3, 1),
                    "wall_time_ratio": round(sim_seconds / ort_seconds, 2),
                    # the model's MACs at numpy's float32 GEMM rate: no numpy simulator is faster
                    "float32_gemm_floor_ms": round(summary["macs"] / gemm_rate * 1e3, 1),
                    "float32_gemm_floor_ratio": round(summary["macs"] / gemm_rate / ort_seconds, 2),
                    "simulator_floor_ratio": round(sim_seconds * gemm_rate / summary["macs"], 2),
                    "simulator_cpu_ms": round(sim_cpu_seconds * 1e3, 1),
                    "float32_gemm_floor_cpu_ms": round(summary["macs"] / gemm_cpu_rate * 1e3, 1),
                    "simulator_floor_ratio_cpu": round(
                        sim_cpu_seconds * gemm_cpu_rate / summary["macs"], 2
                    ),
                    "simulator_first_run_ms": round(first_seconds * 1e3, 1),
                    "cycles": summary["cycles"],
                    "roofline_cycles": summary["roofline_cycles"],
                    "roofline_ratio": summary["roofline_ratio"],
                    "mac_utilization": summary["mac_utilization"],
                    "sram_peak_bytes": summary["sram_peak_bytes"],
                    "sram_bytes": hw.sram_bytes,
                    "compiled_kernels": kernels.compiled() is not None,
                }
            )
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    with threadpool_limits(limits=1, user_api="blas"):  # see the module docstring
        main()
