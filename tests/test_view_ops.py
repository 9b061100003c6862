"""The registry's view ops (`OpDef.view`) hand on their input's bytes, and the targets treat
exactly those as free: the host CPU model charges them dispatch only and the TRIX lowering
makes them reshape layers."""

import numpy as np
import pytest

from onebuild.graph_ir.ir import Graph
from onebuild.graph_ir.ops import OPS
from onebuild.targets.host_cpu import HostCpu
from onebuild.targets.trix_sim.lower import LOWERINGS, VIEWS

VIEW_ATTRS = {"Reshape": {"shape": [2, 12]}}


@pytest.mark.parametrize("op", [name for name, op in OPS.items() if op.view])
def test_a_view_hands_on_its_inputs_bytes(op, rng):
    x = rng.normal(size=(2, 3, 4)).astype(np.float32)
    y = OPS[op].kernel(VIEW_ATTRS.get(op, {}), x)[0]
    assert y.dtype == x.dtype and y.tobytes() == x.tobytes()
    graph = Graph()
    node = graph.make_node(op, [graph.add_input("x", x.dtype, x.shape)], VIEW_ATTRS.get(op, {}))
    cpu = HostCpu()
    assert cpu.node_us(node) == cpu.op_overhead_us
    assert op in VIEWS and op in LOWERINGS


def test_an_op_that_computes_is_not_free_on_the_cpu():
    graph = Graph()
    node = graph.make_node("Relu", [graph.add_input("x", np.dtype("float32"), (2, 3, 4))])
    assert not OPS["Relu"].view and HostCpu().node_us(node) > HostCpu().op_overhead_us
