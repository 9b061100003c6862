"""The pure helpers of bench/vela.py: reading Vela's summary CSV and its CPU-operator lines."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

_PATH = Path(__file__).resolve().parent.parent / "bench" / "vela.py"
_spec = importlib.util.spec_from_file_location("bench_vela", _PATH)
vela = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(vela)

# columns of the summary Vela 5.2.0 wrote for squeezenet (Ethos_U65_Client_Server)
SUMMARY = (
    "experiment,network,accelerator_configuration,core_clock,nn_macs,cycles_npu,cycles_total\n"
    "default,squeezenet,Ethos_U65_256,1000000000.0,353018768,3035412,3043536\n"
)

# lines of `vela --show-cpu-operations` (format of Vela 5.2.0's stats_writer)
STDOUT = """CPU operators = 3 (4.2%)
NPU operators = 68 (95.8%)
   CPU: Div = p2o.Div.0 (outputs [1, 100, 76, 96])
   CPU: Div = p2o.Div.1 (outputs [1, 50, 38, 96])
   CPU: Exp = exp_0 (outputs [1, 1, 1, 8])
   NPU: Conv2D = r0_q (outputs [1, 111, 111, 64])
   NPU: Relu = r0_q (outputs [1, 111, 111, 64])
"""


def test_summary_values_are_numbers_and_names_stay_text():
    summary = vela.parse_vela_summary(SUMMARY)
    assert summary["cycles_total"] == 3043536.0
    assert summary["cycles_npu"] == 3035412.0
    assert summary["core_clock"] == 1e9
    assert summary["accelerator_configuration"] == "Ethos_U65_256"


@pytest.mark.parametrize("text", ["", "a,b\n", "a,b\n1\n"])
def test_a_summary_without_matching_rows_is_refused(text):
    with pytest.raises(ValueError, match="header row and a value row"):
        vela.parse_vela_summary(text)


def test_cpu_operators_are_counted_by_type_and_npu_ones_ignored():
    assert vela.parse_cpu_operators(STDOUT) == {"Div": 2, "Exp": 1}
    assert (
        vela.parse_cpu_operators("CPU operators = 0 (0.0%)\n   NPU: Conv2D = x (outputs [1])") == {}
    )


# rows of the per-layer CSV Vela 5.2.0 wrote for the layout detector (--verbose-performance)
PER_LAYER = (
    (
        "Original Operator,NNG Operator,Target,Staging Usage,Peak% (Staging),Op Cycles,"
        "Network% (cycles),NPU,SRAM AC,DRAM AC,OnFlash AC,OffFlash AC,MAC Count,Network% (MAC),"
        "Util% (MAC),Name\n"
    )
    + """\
Transpose,Transpose,NPU,0,0.0,1459200,3.04,973050,0,1459200,0,0,0,0.0,0.0,#1024
Conv2D,Conv2D,NPU,332848,64.84,2338266,4.87,1950109,157700,0,0,0,1000,1.0,1.0,conv_0
HardSwish,LUT,NPU,0,0.0,0,0.0,0,0,0,0,0,0,0.0,0.0,conv_0
Conv2D,Conv2D,NPU,332848,64.84,100,0.1,100,0,0,0,0,10,0.0,1.0,conv_1
"""
)


def test_per_layer_cycles_are_summed_by_operator_type_largest_first():
    layers = vela.parse_vela_layers(PER_LAYER)
    assert layers == {"Conv2D": 2338366, "Transpose": 1459200, "HardSwish": 0}
    assert list(layers) == ["Conv2D", "Transpose", "HardSwish"]


@pytest.mark.parametrize(
    ("channels", "size", "bound"),
    [
        (64, 16, "compute"),  # 16x16x64 outputs x 64 x 9 MACs / 256 > bytes / 12
        (256, 1, "memory"),  # 1x1 outputs: the 2.4 MB of float weights dominate
    ],
)
def test_roofline_is_the_larger_of_mac_and_byte_time(channels, size, bound):
    from onnx import helper
    from onnx_builders import make_model

    from onebuild.graph_ir.serde.onnx_import import import_onnx

    rng = np.random.default_rng(0)
    weights = rng.standard_normal((channels, channels, 3, 3)).astype(np.float32)
    bias = np.zeros(channels, np.float32)
    conv = helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])
    proto = make_model(
        [conv], [("x", [1, channels, size, size])], ["y"], [("w", weights), ("b", bias)]
    )
    graph = import_onnx(proto).main
    result = vela.roofline_cycles(graph)
    macs = size * size * channels * channels * 9
    nbytes = 4 * (weights.size + bias.size + 2 * channels * size * size)
    assert result["macs"] == macs and result["bytes"] == nbytes
    cycles = {"compute": macs / 256, "memory": nbytes / 12}
    assert result["cycles"] == round(cycles[bound]) == round(max(cycles.values()))
