"""Automatic mixed precision: the fewest multiply-accumulates promoted to a higher-precision
type until the quantized model's output SQNR reaches a target.

1. Quantize everything to the base type and measure the SQNR of every output and of every layer
   against the float model on evaluation samples (`evaluate.compare_graphs`).
2. Rank the quantized layers by the noise each one adds per unit of work: a layer's relative
   noise, averaged over its channels (a BatchNorm-folded channel with a thousandth of the range
   of its neighbours loses all its codes, and the next layer scales it back up), minus the
   largest relative noise it receives from its inputs, divided by its MACs plus its output size
   (elementwise layers cost little but not nothing), the work being that of everything the
   promotion takes: the data-movement ops after the layer that keep its quantization
   parameters (MaxPool, Reshape, ...) and the layers that read the result, since a layer
   converts its inputs to its own type.
3. Promote the first k layers of that ranking; find the smallest k that meets the target by
   bisection (each probe quantizes and measures again), within the MAC budget if one is given;
   then try leaving out each of the first k - 1 again (up to MAX_PRUNING_PROBES), keeping
   every omission the target survives.

The search is deterministic (same graph, statistics and samples: same choice) and every step is
recorded: `MixedPrecisionResult.record` is what the build reports.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from ..ir import Graph, Node
from ..macs import graph_macs, macs
from ..ops import OPS
from .config import LayerOverride, QuantConfig
from .evaluate import Batch, Comparison, compare_graphs
from .model_io import is_quantized

KEEPS_PARAMETERS = ("passthrough", "pad")  # quant rules whose output takes the input's params
MAX_PRUNING_PROBES = 12


@dataclass(frozen=True)
class MixedPrecisionTarget:
    target_sqnr_db: float
    dtype: str = "int16"  # the higher-precision type: "int16", or "float32" (CPU parts)
    max_high_precision_mac_fraction: float | None = None


@dataclass
class MixedPrecisionResult:
    graph: Graph
    record: dict


def _worst_output_db(comparison: Comparison) -> float:
    return min(summary["sqnr_db"] for summary in comparison.outputs.values())


def _added_noise(float_graph: Graph, layers: list[dict]) -> dict[str, float]:
    """Relative noise each compared layer adds on top of what its inputs carry."""
    ratio = {layer["node"]: layer["channel_noise_ratio"] for layer in layers}
    memo: dict[int, float] = {}

    def carried(node: Node | None) -> float:
        """The relative noise arriving at a node's output from upstream (nearest compared
        producers, through ops that were not compared)."""
        if node is None:
            return 0.0
        if node.name in ratio:
            return ratio[node.name]
        if id(node) not in memo:
            memo[id(node)] = 0.0  # cycles cannot occur, but keep the recursion bounded
            memo[id(node)] = max(incoming(node), default=0.0)
        return memo[id(node)]

    def incoming(node: Node) -> list[float]:
        return [carried(v.producer) for v in node.inputs if v is not None and not v.is_const]

    added = {}
    for node in float_graph.nodes:
        if node.name in ratio:
            added[node.name] = max(ratio[node.name] - max(incoming(node), default=0.0), 0.0)
    return added


def _unit(node: Node) -> list[Node]:
    """What must run in the higher type for `node`'s output to keep it: the node, the ops after
    it that keep its quantization parameters (MaxPool, Reshape, ...), and the layers that read
    the result (a layer converts its inputs to its own type)."""
    unit, frontier = [node], [node]
    while frontier:
        for reader in frontier.pop().outputs[0].users:
            if reader in unit:
                continue
            unit.append(reader)
            if OPS[reader.op].quant in KEEPS_PARAMETERS:
                frontier.append(reader)
    return unit


def rank_layers(float_graph: Graph, quantized: Graph, comparison: Comparison) -> list[list[str]]:
    """Per quantized layer, the names of its unit (see `_unit`), most noise added per unit of
    work first (ties by graph order)."""
    quantized_names = {
        node.name for node in quantized.nodes if node.outputs and is_quantized(node.outputs[0])
    }
    added = _added_noise(float_graph, comparison.layers)
    order = {node.name: index for index, node in enumerate(float_graph.nodes)}
    units, scores = {}, {}
    for node in float_graph.nodes:
        if node.name not in added or node.name not in quantized_names:
            continue
        if OPS[node.op].quant in KEEPS_PARAMETERS:
            continue  # in the unit of the layer it follows
        unit = _unit(node)
        units[node.name] = [n.name for n in unit]
        work = sum(macs(n) + n.outputs[0].size for n in unit)
        scores[node.name] = added[node.name] / work
    ranked = sorted(scores, key=lambda name: (-scores[name], order[name]))
    return [units[name] for name in ranked]


def search(
    float_graph: Graph,
    build: Callable[[QuantConfig], Graph],
    config: QuantConfig,
    batches: Sequence[Batch],
    target: MixedPrecisionTarget,
) -> MixedPrecisionResult:
    """Quantize with `build(config)` and promote layers to `target.dtype` until the worst
    output's SQNR on `batches` reaches `target.target_sqnr_db` (see the module docstring)."""
    named = [(f"sample batch {i}", batch) for i, batch in enumerate(batches)]
    node_macs = {node.name: macs(node) for node in float_graph.nodes}
    total_macs = max(graph_macs(float_graph), 1)
    steps: list[dict] = []

    def probe(promoted: Sequence[str]) -> tuple[Graph, Comparison]:
        layers = config.layers
        if promoted:
            layers = (*layers, LayerOverride(tuple(promoted), target.dtype))
        graph = build(replace(config, layers=layers))
        comparison = compare_graphs(float_graph, graph, named)
        steps.append(
            {
                "promoted": len(promoted),
                "high_precision_mac_fraction": fraction(promoted),
                "sqnr_db": _worst_output_db(comparison),
            }
        )
        return graph, comparison

    def fraction(promoted: Sequence[str]) -> float:
        return sum(node_macs[name] for name in promoted) / total_macs

    graph, comparison = probe(())
    met = _worst_output_db(comparison) >= target.target_sqnr_db
    if met:
        return _result(graph, (), _worst_output_db(comparison), target, fraction, steps)
    units = rank_layers(float_graph, graph, comparison)

    def promoted(count: int) -> list[str]:
        return list(dict.fromkeys(name for unit in units[:count] for name in unit))

    limit = len(units)
    if target.max_high_precision_mac_fraction is not None:
        while limit and fraction(promoted(limit)) > target.max_high_precision_mac_fraction:
            limit -= 1
    chosen = promoted(limit)
    if limit:
        graph, comparison = probe(chosen)
    if _worst_output_db(comparison) < target.target_sqnr_db:
        return _result(graph, chosen, _worst_output_db(comparison), target, fraction, steps)
    low, high = 0, limit  # the target fails with `low` promoted units, holds with `high`
    while high - low > 1:
        middle = (low + high) // 2
        attempt, measured = probe(promoted(middle))
        if _worst_output_db(measured) >= target.target_sqnr_db:
            high, graph, comparison, chosen = middle, attempt, measured, promoted(middle)
        else:
            low = middle
    # The ranking is a heuristic: drop the units the target does not need after all.
    kept = list(units[:high])
    for unit in units[: min(high - 1, MAX_PRUNING_PROBES)]:
        trial = [u for u in kept if u is not unit]
        names = list(dict.fromkeys(name for u in trial for name in u))
        if fraction(names) == fraction(chosen):
            continue
        attempt, measured = probe(names)
        if _worst_output_db(measured) >= target.target_sqnr_db:
            kept, graph, comparison, chosen = trial, attempt, measured, names
    return _result(graph, chosen, _worst_output_db(comparison), target, fraction, steps)


def _result(graph, promoted, reached, target, fraction, steps) -> MixedPrecisionResult:
    record = {
        "target_sqnr_db": target.target_sqnr_db,
        "dtype": target.dtype,
        "promoted": list(promoted),
        "high_precision_mac_fraction": fraction(promoted),
        "sqnr_db": reached,
        "target_met": bool(reached >= target.target_sqnr_db),
        "steps": steps,
    }
    return MixedPrecisionResult(graph, record)
