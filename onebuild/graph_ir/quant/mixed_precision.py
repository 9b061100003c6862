"""Automatic mixed precision: the fewest multiply-accumulates promoted to a higher-precision type
until the quantized model's output SQNR reaches a target.

1. Quantize everything to the base type and measure every output against the float model on
   the evaluation samples; met: done. Then promote everything: the noise left is the floor
   (a target the floor misses cannot be met: that model is returned and said, or the base
   model when promoting everything exceeds `max_high_precision_mac_fraction`).
2. Measure what each layer costs at the outputs when it alone is quantized
   (`sensitivity.isolated_output_noise`, on the first SENSITIVITY_SAMPLES samples, each layer
   output also clipped to the range the other samples reach): the noise it adds, carried
   through the float network downstream, as a fraction of the noise the target allows on
   top of the floor. Layers under NEGLIGIBLE_MAC_FRACTION of the MACs are
   promoted unmeasured. A unit is a layer with the data-movement ops after it that keep its
   quantization parameters (MaxPool, Reshape, ...).
3. Take noises as adding up, so keeping a set of layers in the base type is a knapsack: the
   most work (MACs plus output elements) kept low for a noise sum under a bound. Greedily, by
   work per unit of noise, fill the bound `scale` (1 = the allowed noise) and promote the
   rest; probe the result (quantize and measure again; `probes.Probes` computes the float
   outputs once and reruns only the nodes a candidate changed), and move `scale` by SCALE_STEP up
   while the target holds, down until it does, then bisect to within BRACKET (at most
   MAX_PROBES probes), within the MAC budget if one is given (from the smallest bound whose set
   fits it, `budget_bound`). The probes correct what the sum gets wrong. A budget too small
   for the target returns the best set probed within it, recorded with `target_met` false.
4. Trim: from the smallest set that holds, put the REFINE_PROBES measured units with the most
   work back in the base type one at a time, keeping each change that still holds (on the
   measured SQNR; a probe that cannot hold stops early): the sum misjudges single layers too
   (on the PP-OCR classifier one promoted convolution cost 2.7 dB; demoted, the model reached
   36.4 instead of 33.7 dB with 33.1 instead of 40.6 % of the MACs promoted; on the PP-OCR
   recognizer a set holding by 0.1 dB held by 0.6 with its largest unit, 15.7 % of the MACs,
   demoted). A failure while the set holds by less than DEMOTE_MARGIN_DB ends the pass
   (closer to the target most demotions fail); `trim_probes` tries that many whatever the
   margin (8 on the real models: 2.4-3.7 % fewer MACs on 5 of 12 searches, at up to 8 more
   probes and some of the margin held-out data had).

The search is deterministic (same graph, statistics and samples: same choice) and every probe is
recorded: `MixedPrecisionResult.record` is what the build reports (with, under "sensitivity",
the REPORTED_LAYERS layers that cost the most alone).
"""

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from ..ir import Graph, Node
from ..macs import graph_macs, macs
from ..metrics import sqnr_db
from ..ops import OPS
from ..ops.registry import KEEPS_PARAMETERS
from .channel_activations import depthwise_edges
from .config import LayerOverride, QuantConfig
from .empirical_bias import BiasCorrector
from .evaluate import Batch, Comparison
from .model_io import is_quantized
from .output_promotion import OutputPlan, edge_producers, output_writers, split_edges
from .probes import Probes
from .sensitivity import isolated_output_noise

SENSITIVITY_SAMPLES = 4
SCALE_STEP = 1.5
MIN_STEP = 1.05  # the smallest step down after a probe that missed the target
BRACKET = 1.25  # bisection stops when the bound that failed is within this of one that held
MAX_PROBES = 8  # after the base-type and all-promoted probes
BUDGET_PRECISION = 1.001  # the bound that fills a MAC budget, found to within this ratio
BISECTIONS = 30  # (at most; estimates only, no probes)
# Units below this share of the MACs are promoted whatever they cost on the measured samples:
# promoting them costs (nearly) nothing, and on unseen data they are the first to overshoot
# their calibrated range (squeeze-excitation gates, pooled features, the classifier: on the
# PP-OCR classifier's held-out lines they cost 20-26 dB alone, 44-56 dB on calibration lines).
NEGLIGIBLE_MAC_FRACTION = 0.001
REFINE_PROBES = 4  # then the largest promoted units are tried back in the base type, one each,
DEMOTE_MARGIN_DB = 1.0  # until one fails with less than this margin left (unless trim_probes)
REPORTED_LAYERS = 10  # the record lists the layers that cost the most alone


@dataclass(frozen=True)
class MixedPrecisionTarget:
    target_sqnr_db: float
    dtype: str = "int16"  # the higher-precision type: "int16", or "float32" (CPU parts)
    max_high_precision_mac_fraction: float | None = None
    trim_probes: int | None = None  # None: REFINE_PROBES, up to a failure within DEMOTE_MARGIN_DB
    # the layers kept in the base type write `dtype` (activation-only promotion; see `search`)
    promote_outputs: bool = False


@dataclass
class MixedPrecisionResult:
    graph: Graph
    record: dict


def _worst_output_db(comparison: Comparison) -> float:
    return min(summary["sqnr_db"] for summary in comparison.outputs.values())


def _noise_ratios(comparison: Comparison) -> dict[str, float]:
    """Noise power / signal power per output."""
    return {name: 10 ** (-s["sqnr_db"] / 10) for name, s in comparison.outputs.items()}


def _unit(node: Node) -> list[Node]:
    """`node` and the ops after it that keep its quantization parameters (MaxPool, ...)."""
    unit, frontier = [node], [node]
    while frontier:
        for reader in frontier.pop().outputs[0].users:
            if reader not in unit and OPS[reader.op].quant in KEEPS_PARAMETERS:
                unit.append(reader)
                frontier.append(reader)
    return unit


def layer_units(float_graph: Graph, quantized: Graph) -> dict[str, list[str]]:
    """Per quantized layer (graph order), the names of its unit (see `_unit`)."""
    quantized_names = {
        node.name for node in quantized.nodes if node.outputs and is_quantized(node.outputs[0])
    }
    return {
        node.name: [n.name for n in _unit(node)]
        for node in float_graph.nodes
        if node.name in quantized_names and OPS[node.op].quant not in KEEPS_PARAMETERS
    }


def edge_units(
    float_graph: Graph, units: dict[str, list[str]]
) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """`units` with the layers of each per-channel edge (`channel_activations`: the producing
    Conv, its table and the scalar ops the table absorbs, the depthwise Convs) merged into one
    unit, keyed by its first layer, so an edge is promoted whole: a split edge is quantized per
    tensor in both types. Returns (units, the measurable layers of each unit): a table that
    absorbs scalar ops has no twin of its own output, so it is not measured alone."""
    merged: dict[str, list[str]] = {}
    members: dict[str, list[str]] = {}
    home: dict[str, str] = {}  # layer -> key of the merged unit holding it
    for edge in depthwise_edges(float_graph):
        layers = [n.name for n in edge.nodes if n.name in units]
        keys = list(dict.fromkeys(home.get(layer, layer) for layer in layers))
        if not layers:
            continue
        key = min(keys, key=list(units).index)
        names = [name for k in keys for name in merged.pop(k, units[k])]
        names += [n.name for n in edge.nodes if n.name not in names]
        skip = edge.table.name if edge.affine else None
        measurable = [m for k in keys for m in members.pop(k, [k]) if m != skip]
        merged[key], members[key] = list(dict.fromkeys(names)), measurable
        home.update(dict.fromkeys([n for n in merged[key] if n in units], key))
    result = {
        layer: merged.get(layer, unit)
        for layer, unit in units.items()
        if home.get(layer, layer) == layer
    }
    return result, {layer: members.get(layer, [layer]) for layer in result}


def _equal_batches(a: Batch, b: Batch) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def _first(batches: Sequence[Batch], count: int) -> Batch:
    """The first `count` samples of `batches`, as one batch."""
    return {name: np.concatenate([batch[name] for batch in batches])[:count] for name in batches[0]}


def keep_order(cost: dict[str, float], work: dict[str, float], order: dict[str, int]) -> list[str]:
    """Units by work kept in the base type per unit of noise cost, most first (ties: graph
    order)."""
    return sorted(cost, key=lambda n: (-work[n] / max(cost[n], 1e-300), order[n]))


def kept_within(ranked: list[str], cost: dict[str, float], bound: float) -> set[str]:
    """Greedy knapsack: walk `ranked`, keeping each unit whose cost still fits in `bound`."""
    kept, spent = set(), 0.0
    for name in ranked:
        if math.isfinite(cost[name]) and spent + cost[name] <= bound:
            kept.add(name)
            spent += cost[name]
    return kept


def search(
    float_graph: Graph,
    build: Callable[[QuantConfig], Graph],
    config: QuantConfig,
    batches: Sequence[Batch],
    target: MixedPrecisionTarget,
    correct: BiasCorrector | None = None,
) -> MixedPrecisionResult:
    """Quantize with `build(config)` and promote layers to `target.dtype` until the worst
    output's SQNR on `batches` reaches `target.target_sqnr_db` (see the module docstring).
    `correct` (empirical bias correction) changes every candidate in place before it is
    measured, so the probes measure the model the build writes."""
    measure = Probes(float_graph, batches)
    # the correction's pass computes each candidate's outputs on its samples: when they are
    # the probes' own, the probes read them instead of running the candidate again
    same_samples = correct is not None and _equal_batches(correct.batch, measure.samples())
    node_macs = {node.name: macs(node) for node in float_graph.nodes}
    total_macs = max(graph_macs(float_graph), 1)
    steps: list[dict] = []
    budget = target.max_high_precision_mac_fraction

    def fraction(promoted: Sequence[str]) -> float:
        return sum(node_macs[name] for name in promoted) / total_macs

    # promote_outputs: which layers kept low write the higher type (filled once units are known)
    plan = OutputPlan(target.dtype, config.dtype) if target.promote_outputs else None

    def configured(promoted: Sequence[str]) -> QuantConfig:
        layers = config.layers
        if promoted:
            layers = (*layers, LayerOverride(tuple(promoted), target.dtype))
        if plan is not None:
            layers = (*layers, *plan.overrides(promoted))
        return replace(config, layers=layers)

    def probe(promoted: Sequence[str], exact: bool = False) -> tuple[Graph, Comparison]:
        """Quantize with `promoted` in the higher type (`plan`: the others' outputs as it
        says) and measure; unless `exact` or a MAC budget may choose a set that misses the
        target, stop once it cannot be met."""
        graph = build(configured(promoted))
        outputs = None
        if correct is not None:
            correct(graph)
            outputs = correct.outputs if same_samples else None
        give_up = None if exact or budget is not None else target.target_sqnr_db
        comparison = measure.compare(graph, give_up_below=give_up, computed=outputs)
        step = {"promoted": len(promoted), "high_precision_mac_fraction": fraction(promoted)}
        if plan is not None:
            step["promoted_outputs"] = len(plan.promoted_outputs(promoted))
        if comparison.complete:
            step["sqnr_db"] = _worst_output_db(comparison)
        else:  # stopped: the target is out of reach; the SQNR is at most this
            step.update(sqnr_db_at_most=_worst_output_db(comparison), samples=comparison.samples)
        steps.append(step)
        return graph, comparison

    def met(comparison: Comparison) -> bool:
        return _worst_output_db(comparison) >= target.target_sqnr_db

    base_graph, base = probe(())
    if met(base):
        return _result(base_graph, (), base, target, fraction, steps)
    if config.fold_scales and config.activation_granularity == "channel":
        # the candidates fold no edge: a promotion that splits one loses it in both types
        # (the layout detector needed 90.8 % of MACs in int16 for 30 dB with them, 63.5 %
        # without); the base above kept them, and is the answer when it meets the target
        config = replace(config, fold_scales=False)
        base_graph, base = probe(())
    units = layer_units(float_graph, base_graph)
    members = {layer: [layer] for layer in units}
    channel = config.activation_granularity == "channel"
    if channel:
        split = split_edges(float_graph, units) if plan is not None else None
        if split is None:
            units, members = edge_units(float_graph, units)
        else:
            units, members, plan.edges = split

    def promoted(kept: set[str]) -> list[str]:
        return [name for layer, unit in units.items() if layer not in kept for name in unit]

    def finish(graph, chosen, comparison) -> MixedPrecisionResult:
        extra = None
        if plan is not None:  # computing in one type, writing the other (MACs: the first)
            extra = {
                "promoted_outputs": plan.promoted_outputs(chosen),
                "demoted_outputs": plan.demoted_outputs(chosen),
            }
        return _result(graph, chosen, comparison, target, fraction, steps, extra)

    everything = promoted(set())
    graph, comparison = probe(everything, exact=True)  # the floor: reported when it misses
    if not met(comparison):  # the floor misses the target: nothing can meet it
        if budget is not None and fraction(everything) > budget:
            graph, everything, comparison = base_graph, [], base
        return finish(graph, everything, comparison)
    floor = _noise_ratios(comparison)
    aim = 10 ** (-target.target_sqnr_db / 10)
    allowed = {o: max(aim - r, 1e-30) for o, r in floor.items()}
    measured = [layer for layer, unit in units.items() if fraction(unit) >= NEGLIGIBLE_MAC_FRACTION]
    alone_layers = [member for layer in measured for member in members[layer]]
    if plan is None:
        twins = base_graph if correct is None else build(config)  # each layer's own bias
    else:  # the base: every unit with MACs computes low and writes high
        plan.writers = output_writers(
            float_graph, units, measured, edge_producers(float_graph) if channel else set()
        )
        low_set = promoted(set(measured))
        low_graph, low_comparison = probe(low_set)
        if met(low_comparison):
            return finish(low_graph, low_set, low_comparison)
        twins = low_graph if correct is None else build(configured(low_set))
        twins = {node.name: node for node in twins.nodes}
        if plan.edges:  # each edge producer alone, writing its promoted edge
            edges = set(plan.edges.values())
            producers = build(configured(promoted(set(measured) - edges)))
            twins.update({n.name: n for n in producers.nodes if n.name in plan.edges})
    signal, layer_noise = isolated_output_noise(
        float_graph, twins, _first(batches, SENSITIVITY_SAMPLES), alone_layers
    )
    noise = {  # a merged edge's layers: their noises added
        layer: {o: sum(layer_noise[m][o] for m in members[layer]) for o in signal}
        for layer in measured
    }
    cost = dict.fromkeys(units, math.inf)  # negligible layers are always promoted
    for layer in measured:
        cost[layer] = max(
            noise[layer][o] / signal[o] / allowed[o] if signal[o] else 0 for o in allowed
        )
    nodes = {node.name: node for node in float_graph.nodes}
    work = {
        layer: sum(macs(nodes[n]) + nodes[n].outputs[0].size for n in unit)
        for layer, unit in units.items()
    }
    order = {name: index for index, name in enumerate(units)}
    ranked = keep_order(cost, work, order)

    def chosen_at(scale: float) -> list[str]:
        return promoted(kept_within(ranked, cost, scale))

    total = sum(c for c in cost.values() if math.isfinite(c))
    low = 0.0  # the smallest bound within the MAC budget (past the sum, nothing changes)
    if budget is not None:
        low = budget_bound(lambda bound: fraction(chosen_at(bound)) <= budget, total)
    probes: dict[tuple, tuple[Graph, list[str], Comparison]] = {
        (): (base_graph, [], base),
        tuple(everything): (graph, everything, comparison),
    }
    if plan is not None:  # the plain base is not a candidate: its kept layers write low
        probes = {tuple(everything): probes[tuple(everything)]}
        probes[tuple(low_set)] = (low_graph, low_set, low_comparison)

    def tried(chosen: list[str]) -> tuple[Graph, list[str], Comparison]:
        """The probe of promoting `chosen` (each set probed once)."""
        if tuple(chosen) not in probes:
            graph, comparison = probe(chosen)
            probes[tuple(chosen)] = (graph, chosen, comparison)
        return probes[tuple(chosen)]

    held, failed, scale = None, None, max(1.0, low)
    for _ in range(MAX_PROBES):
        comparison = tried(chosen_at(scale))[2]
        if met(comparison):
            held = scale if held is None else max(held, scale)
        else:
            failed = scale if failed is None else min(failed, scale)
        if held is not None and failed is not None:
            if failed / held < BRACKET:
                break
            scale = (held * failed) ** 0.5
        elif held is not None:
            scale *= SCALE_STEP
        elif scale <= low:
            break
        else:
            scale = scale_down(scale, _worst_output_db(comparison), target.target_sqnr_db, low)
    within = [p for p in probes.values() if budget is None or fraction(p[1]) <= budget]
    holding = [p for p in within if met(p[2])]
    if holding:
        best = min(holding, key=lambda p: fraction(p[1]))
        graph, chosen, comparison = best
        trims, margin = target.trim_probes, None
        if trims is None:  # a failure with less than DEMOTE_MARGIN_DB to spare ends the pass
            trims, margin = REFINE_PROBES, lambda c: _worst_output_db(c) - target.target_sqnr_db
        if trims:
            largest = sorted(measured, key=lambda layer: (-work[layer], order[layer]))
            graph, chosen, comparison = _demote(best, largest, units, tried, met, trims, margin)
    else:  # the budget is too small: the best output within it, said as not met
        graph, chosen, comparison = max(within, key=lambda p: _worst_output_db(p[2]))
    result = finish(graph, chosen, comparison)
    alone = {  # each measured layer's worst output SQNR when it alone is in the base type
        layer: min(sqnr_db(signal[o], noise[layer][o]) for o in signal) for layer in measured
    }
    worst = worst_first(alone, order)[:REPORTED_LAYERS]
    result.record["sensitivity"] = [{"node": n, "sqnr_db_alone": alone[n]} for n in worst]
    low = [layer for layer in worst_first(alone, order) if not set(units[layer]) & set(chosen)]
    result.record["kept_low"] = [  # where the noise left comes from, by the isolated estimate
        {"node": n, "sqnr_db_alone": alone[n], "mac_fraction": fraction(units[n])}
        for n in low[:REPORTED_LAYERS]
    ]
    return result


def worst_first(alone: dict[str, float], order: dict[str, int]) -> list[str]:
    """Measured units by their SQNR alone, the noisiest first (ties: graph order)."""
    return sorted(alone, key=lambda layer: (alone[layer], order[layer]))


def budget_bound(within: Callable[[float], bool], total: float) -> float:
    """The smallest noise bound whose chosen set is `within` the MAC budget, to within
    BUDGET_PRECISION (the most MACs the estimate lets the budget promote; a budget that
    misses the target gets its best set from this bound): up by SCALE_STEP, then bisected.
    Past `total`, the sum of the costs, no bound keeps more: a bound above it is returned."""
    low, over = 0.0, 0.0
    while low <= total and not within(low):
        over, low = low, max(low * SCALE_STEP, 1 / SCALE_STEP**8)
    if low == 0.0 or low > total:
        return low
    for _ in range(BISECTIONS):
        if low <= over * BUDGET_PRECISION:
            break
        middle = (low + over) / 2
        low, over = (middle, over) if within(middle) else (low, middle)
    return low


def scale_down(scale: float, reached_db: float, target_db: float, low: float) -> float:
    """The next noise bound after a probe at `scale` reached `reached_db` short of `target_db`:
    shrunk by the measured excess of noise, between MIN_STEP (a near miss promotes a few more
    layers, not a third more of the noise budget) and SCALE_STEP, and not below `low`."""
    excess = 10 ** ((target_db - reached_db) / 10)
    return max(scale / min(max(excess, MIN_STEP), SCALE_STEP), low)


def _demote(best, layers, units, tried, met, count: int = REFINE_PROBES, margin=None):
    """Starting from the `best` (graph, promoted, comparison) that meets the target, put the
    first `count` promoted units of `layers` back in the base type, one at a time, keeping
    each change that still meets it (one probe each). With `margin` (comparison -> dB above
    the target), a demotion that fails while the set holds by less than DEMOTE_MARGIN_DB
    ends the pass: there is little noise left to spare for the next."""
    promoted = [layer for layer in layers if set(units[layer]) <= set(best[1])]
    for layer in promoted[:count]:
        trial = tried([name for name in best[1] if name not in units[layer]])
        if met(trial[2]):
            best = trial
        elif margin is not None and margin(best[2]) < DEMOTE_MARGIN_DB:
            break
    return best


def _result(graph, promoted, comparison, target, fraction, steps, extra=None):
    reached = _worst_output_db(comparison)
    record = {
        "target_sqnr_db": target.target_sqnr_db,
        "dtype": target.dtype,
        "max_high_precision_mac_fraction": target.max_high_precision_mac_fraction,
        "promoted": list(promoted),
        "high_precision_mac_fraction": fraction(promoted),
        "sqnr_db": reached,
        "target_met": bool(reached >= target.target_sqnr_db),
        "steps": steps,
    }
    record.update(extra or {})
    return MixedPrecisionResult(graph, record)
