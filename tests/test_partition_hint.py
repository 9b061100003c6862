"""The capability strategy names the cost strategy when its latency estimate is clearly lower
(PP-OCR's recognizer: 20 parts, 9 NPU parts of one or two nodes; cost gave 4 parts and ~12 %
less, and the build did not say so). The hint's figures are those of a cost partition."""

import pytest
from test_trix_sim import _conv_graph, integer_graph

from onebuild import compile as api
from onebuild.targets.placement import HINT_RATIO, report_lines


@pytest.mark.parametrize("shape", [(3, 5, 5, 4, 3, 1, 1, 1), (32, 40, 40, 64, 3, 1, 1, 1)])
def test_capability_names_the_cost_strategy_when_it_is_faster(rng, shape):
    graph, data = _conv_graph(rng, *shape)
    quantized = integer_graph(graph, data, "uint8")
    capability = api.partition(quantized, "m").report
    cost = api.partition(quantized, "m", api.PartitionOptions(strategy="cost")).report
    ours, theirs = capability["estimate"]["microseconds"], cost["estimate"]["microseconds"]
    lines = report_lines("m", capability)
    if theirs < HINT_RATIO * ours:
        assert lines[-1].strip() == (
            f'partition.strategy = "cost" estimates {theirs:.0f} us in {len(cost["parts"])} '
            f"part(s), against {ours:.0f} us for these"
        )
    else:
        assert capability["hint"] == "" and "strategy" not in lines[-1]
    assert cost["hint"] == ""
