"""The NPU pictures keep a readable size on models of hundreds of layers: the busy chart draws
the busiest layers and sums the others in one row."""

import re

from onebuild.report.charts_npu import MAX_ROWS, busiest_rows, timeline_chart
from onebuild.report.collect import Binary


def _binary(count: int) -> Binary:
    """A binary's description with `count` layers of growing cost (layer i: 100 + i cycles)."""
    table = {
        f"conv{i}": {"kind": "conv" if i % 2 else "lookup", "cycles": 100 + i,
                     "compute_cycles": 100 + i, "dma_cycles": 50, "macs": 0}
        for i in range(count)
    }  # fmt: skip
    cycles = sum(layer["cycles"] for layer in table.values())
    info = {"layers_table": table, "cycles": cycles, "milliseconds": cycles / 1e6, "hardware": "m"}
    return Binary("codegen.tvn", info, 1024, 16)


def _height_pt(svg: str) -> float:
    return float(re.search(r'<svg[^>]*height="([\d.]+)pt"', svg).group(1))


def test_the_busy_chart_keeps_its_size_on_137_layers():
    small, large = timeline_chart(_binary(10), 0), timeline_chart(_binary(137), 1)
    assert _height_pt(large) <= 72 * 10  # at most 10 inches (was 33 for 137 layers)
    assert _height_pt(large) <= _height_pt(small) + 72 * 0.22 * (MAX_ROWS + 1 - 10) + 1
    names, compute, dma = busiest_rows(list(_binary(137).info["layers_table"].items()))
    # the busiest 24 (conv113 ... conv136) in execution order, then the other 113 summed
    assert names == [f"conv{i}" for i in range(113, 137)] + ["113 others"]
    assert compute[-1] == sum(100 + i for i in range(113))
    assert dma[-1] == 50 * 113
    assert f">{names[0]}<" in large and ">113 others<" in large
    assert ">conv5<" in small  # few layers: every one has its row
