"""Small findings of a new user: an SQNR just under 20 dB printed as "20.0 dB (below 20 dB)";
`inspect --json` on a .tvn gave its layers sorted by name (Conv@0, Conv@1, Conv@10, ...), with
nothing saying the order they run in."""

import json
import subprocess
import sys

import numpy as np
from test_trix_sim import integer_graph

from onebuild.graph_ir.ir import Graph
from onebuild.targets.trix_sim.codegen import generate
from onebuild.targets.trix_sim.hardware import load_hardware
from onebuild.targets.trix_sim.lower import lower
from onebuild.targets.trix_sim.tvn import encode
from onebuild.tasks.quantize import below


def test_a_figure_under_the_threshold_never_prints_as_the_threshold():
    assert below(19.97) == "19.9" and below(19.2) == "19.2" and below(-3.04) == "-3.1"


def test_inspect_json_gives_each_layer_its_place_in_execution_order(rng, tmp_path):
    graph = Graph("chain")
    value = graph.add_input("x", np.float32, (1, 4, 6, 6))
    for i in range(12):  # names sort differently from the order they run in (10 < 2)
        weights = graph.add_constant(rng.normal(0, 0.5, (4, 4, 1, 1)).astype(np.float32))
        attrs = {"strides": [1, 1], "dilations": [1, 1], "pads": [0] * 4, "group": 1}
        value = graph.make_node("Conv", [value, weights], attrs, f"conv{i}").output
    graph.outputs = [value]
    data = {"x": rng.normal(0, 1, (2, 1, 4, 6, 6)).astype(np.float32)}
    quantized = integer_graph(graph, data, "uint8")
    hw = load_hardware("trix-m")
    module = generate(lower(quantized, hw), hw, "memory")
    (tmp_path / "m.tvn").write_bytes(encode(module))
    command = [sys.executable, "-m", "onebuild.cli", "inspect", str(tmp_path / "m.tvn"), "--json"]
    info = json.loads(subprocess.run(command, capture_output=True, check=True).stdout)
    table = info["layers_table"]
    ordered = sorted(table, key=lambda name: table[name]["index"])
    assert ordered == [layer.name for layer in module.layers if layer.name in table]
    assert ordered[:3] == ["conv0", "conv1", "conv2"] and list(table)[2] == "conv10"
