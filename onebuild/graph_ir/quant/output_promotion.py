"""Activation-only promotion in the mixed-precision search (`promote_outputs`).

A Conv/Gemm/MatMul layer kept in the base type (uint8 inputs, int8 weights: 8-bit MACs) writes
its output in the higher type (`LayerOverride.output_dtype`); readers without MACs (tables,
Add/Mul, pooling, data movement) are promoted anyway (they cost no MACs), and a reader with
MACs reads the value requantized to its own type. So every value is in the higher type except
the inputs of layers whose MACs stay low, and a layer's cost in the base type is the rounding
of its inputs and weights alone (its twin in the search's sensitivity runs writes the higher
type).

With per-channel edges (Conv -> [table] -> depthwise Conv, `channel_activations`) the edge's
values are one unit (the table and the depthwise readers: promoted, the producer writes the
higher type into them; kept, it writes the base type per channel) and the producer another
(its own inputs and weights), so a heavy pointwise producer can keep 8-bit MACs while its edge,
and the light depthwise MACs reading it, go to int16.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..ir import Graph
from ..ops import OPS
from .channel_activations import depthwise_edges
from .config import LayerOverride


@dataclass
class OutputPlan:
    """Which layers write which type, for a set of promoted node names."""

    high: str  # the higher type
    low: str  # the base type
    writers: list[str] = field(default_factory=list)  # layers writing `high` when kept low
    edges: dict[str, str] = field(default_factory=dict)  # edge producer -> its edge's unit

    def promoted_outputs(self, promoted: Sequence[str]) -> list[str]:
        """Layers computing in the base type that write the higher type."""
        chosen = set(promoted)
        plain = [name for name in self.writers if name not in chosen]
        edges = [p for p, e in self.edges.items() if e in chosen and p not in chosen]
        return plain + edges

    def demoted_outputs(self, promoted: Sequence[str]) -> list[str]:
        """Edge producers computing in the higher type that write their kept edge's type."""
        chosen = set(promoted)
        return [p for p, e in self.edges.items() if p in chosen and e not in chosen]

    def overrides(self, promoted: Sequence[str]) -> tuple[LayerOverride, ...]:
        """The `output_dtype` overrides of a candidate promoting `promoted`."""
        pairs = (
            (self.promoted_outputs(promoted), self.high),
            (self.demoted_outputs(promoted), self.low),
        )
        return tuple(LayerOverride(tuple(names), output_dtype=t) for names, t in pairs if names)


def split_edges(
    float_graph: Graph, units: dict[str, list[str]]
) -> tuple[dict[str, list[str]], dict[str, list[str]], dict[str, str]] | None:
    """`units` with each per-channel edge's table, absorbed scalar ops and depthwise readers
    made one unit (keyed by its first layer, in the table's place) and its producer left alone.
    Returns (units, the measurable layers of each unit, producer -> edge unit), or None when
    a layer belongs to two edges (then the edges are merged whole, `edge_units`)."""
    edges = [e for e in depthwise_edges(float_graph) if e.producer.name in units]
    claimed = [n.name for e in edges for n in e.nodes]
    if len(claimed) != len(set(claimed)):
        return None
    merged: dict[str, list[str]] = {}
    members: dict[str, list[str]] = {}
    owner: dict[str, str] = {}  # a layer folded into an edge unit -> that unit's key
    producers: dict[str, str] = {}
    for edge in edges:
        chain = (edge.table, *edge.affine, *edge.readers)
        layers = [n.name for n in chain if n is not None and n.name in units]
        if not layers:
            continue
        key = layers[0]
        names = [name for layer in layers for name in units[layer]]
        absorbed = [n.name for n in edge.affine if n.name not in units]
        names += absorbed
        skip = edge.table.name if absorbed else None  # absorbs ops: no twin of its own
        merged[key] = list(dict.fromkeys(names))
        members[key] = [layer for layer in layers if layer != skip]
        owner.update(dict.fromkeys(layers, key))
        producers[edge.producer.name] = key
    result: dict[str, list[str]] = {}
    for layer, unit in units.items():
        key = owner.get(layer, layer)
        if key == layer:
            result[layer] = merged.get(layer, unit)
    return result, {k: members.get(k, [k]) for k in result}, producers


def output_writers(
    float_graph: Graph, units: dict[str, list[str]], measured: list[str], excluded: set[str]
) -> list[str]:
    """The layers that may write the higher type while computing in the base type: the
    Conv/Gemm/MatMul layers of the measured units (the others are promoted whole), but not
    the `excluded` ones (producers of per-channel edges: their output type is their edge's)."""
    nodes = {node.name: node for node in float_graph.nodes}
    return [
        name
        for layer in measured
        for name in units[layer]
        if OPS[nodes[name].op].quant == "matmul" and name not in excluded
    ]


def edge_producers(float_graph: Graph) -> set[str]:
    """The producers of the graph's per-channel edge candidates."""
    return {edge.producer.name for edge in depthwise_edges(float_graph)}
