"""The pure helpers of bench/vela.py: reading Vela's summary CSV and its CPU-operator lines."""

import importlib.util
from pathlib import Path

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
