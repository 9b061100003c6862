"""Where each node of a quantized graph runs, and the parts that follow.

Strategies: `capability` puts every node the accelerator supports on it; `cost` minimizes the
estimated end-to-end latency (target performance model, host CPU model, handoff costs) with a
minimum cut, then drops accelerator parts that do not pay for their invocation, and keeps the
capability result when that is estimated faster. Manual maps (opcode / opname, ONE's .part
style) pin nodes in both. Every node left on the CPU is reported with the reasons.
"""

from dataclasses import dataclass, field
from functools import partial

from ..errors import ModelError, UserError
from ..graph_ir.ir import Graph, Node, Value
from ..graph_ir.macs import macs
from ..graph_ir.partition.assign import min_cost, override
from ..graph_ir.partition.op_keys import check_keys
from ..graph_ir.partition.regions import Partitioning, split
from ..graph_ir.quant.channel_activations import per_channel_value
from . import Target
from .host_cpu import HostCpu

CPU = "cpu"
CONTROL_FLOW = "control flow runs on the CPU"
HINT_RATIO = 0.9  # the capability strategy names the cost one when it estimates 10 % less


@dataclass(frozen=True)
class Options:
    accelerator: str  # backend name of the target ("trix")
    hw: str
    strategy: str = "capability"
    default: str = CPU
    comply: str = "opcode"
    opcode: dict[str, str] = field(default_factory=dict)
    opname: dict[str, str] = field(default_factory=dict)


@dataclass
class Placement:
    backend_of: dict[str, str]
    partitioning: Partitioning
    latency: dict
    fallbacks: list[dict]  # nodes left on the CPU: name, op, reasons
    explanation: list[str]
    hint: str = ""  # capability: the cost strategy's estimate, when clearly faster


def place(
    graph: Graph, name: str, target: Target, options: Options, cpu: HostCpu | None = None
) -> Placement:
    """Assign backends to the nodes of `graph` (quantized I/O) and split it into parts."""
    cpu = cpu or HostCpu()
    if options.default != CPU:
        raise UserError(
            f"partition: the default backend must be '{CPU}', which runs every op "
            f"(got '{options.default}')"
        )
    accel = options.accelerator
    reasons = {
        n.name: [CONTROL_FLOW] if n.subgraphs else target.supports(n, options.hw)
        for n in graph.nodes
    }
    pinned = _pinned(graph, options, reasons)
    _pin_channel_groups(graph, pinned, reasons, options)
    capability = {
        n.name: pinned.get(n.name) or (accel if not reasons[n.name] else options.default)
        for n in graph.nodes
    }
    base = split(graph, capability, name)
    latency = _Latency(target, options.hw, cpu)
    chosen, best, explanation = capability, latency(base), []
    cost = _cost(graph, name, options, cpu, reasons, pinned, (capability, base, best), latency)
    hint = ""
    if options.strategy == "cost":
        chosen, best, explanation = cost
    elif cost[1]["microseconds"] < HINT_RATIO * best["microseconds"]:
        hint = (
            f'partition.strategy = "cost" estimates {cost[1]["microseconds"]:.0f} us in '
            f"{len(split(graph, cost[0], name).parts)} part(s), against "
            f"{best['microseconds']:.0f} us for these"
        )
    partitioning = split(graph, chosen, name)
    fallbacks = [
        {"node": n.name, "op": n.op, "reasons": reasons[n.name] or [_why(n.name, pinned, options)]}
        for n in graph.nodes
        if chosen[n.name] != accel
    ]
    return Placement(chosen, partitioning, best, fallbacks, explanation, hint)


def _why(name: str, pinned: dict, options: Options) -> str:
    if name in pinned:
        return f"placed on {pinned[name]} by the partition opcode/opname maps"
    if options.strategy == "cost":
        return "the cost model estimates it faster on the CPU (handoffs outweigh the NPU gain)"
    return f"the default backend is {options.default}"


def _pinned(graph: Graph, options: Options, reasons: dict[str, list[str]]) -> dict[str, str]:
    """Nodes the manual maps place; naming an impossible placement is an error."""
    backends = {options.accelerator, CPU}
    for key, backend in [*options.opcode.items(), *options.opname.items()]:
        if backend not in backends:
            raise UserError(
                f"partition: '{key}' is mapped to unknown backend '{backend}' "
                f"(backends: {', '.join(sorted(backends))})"
            )
    check_keys(options.opcode, "partition.opcode")
    names = {n.name for n in graph.nodes}
    unknown = sorted(set(options.opname) - names - {"_"})
    if unknown:
        raise UserError(f"partition.opname: no node named {', '.join(map(repr, unknown))}")
    pinned = {}
    for node in graph.nodes:
        backend, explicit = override(node, options.opcode, options.opname, options.comply)
        if backend is None:
            continue
        if backend == options.accelerator and reasons[node.name]:
            if explicit:
                raise ModelError(
                    f"partition: node '{node.name}' ({node.op}) cannot run on "
                    f"{options.accelerator}: {'; '.join(reasons[node.name])}"
                )
            continue  # a blanket `_` mapping leaves unsupported nodes on the CPU
        pinned[node.name] = backend
    return pinned


def _channel_groups(graph: Graph) -> list[list[Node]]:
    """The nodes joined by values quantized per channel, in groups of two or more."""
    leader = {n.name: n.name for n in graph.nodes}

    def find(name: str) -> str:
        while leader[name] != name:
            leader[name] = name = leader[leader[name]]
        return name

    for node in graph.nodes:
        for value in filter(per_channel_value, node.outputs):
            for user in value.users:
                leader[find(user.name)] = find(node.name)
    groups: dict[str, list[Node]] = {}
    for node in graph.nodes:
        groups.setdefault(find(node.name), []).append(node)
    return [group for group in groups.values() if len(group) > 1]


def _pin_channel_groups(graph: Graph, pinned: dict, reasons: dict, options: Options) -> None:
    """A node the maps place on the CPU by name or op type takes the rest of its per-channel
    group with it (values quantized per channel never cross backends), over blanket `_`
    mappings; explicit mappings of one group to both backends are an error."""
    accel = options.accelerator
    for group in _channel_groups(graph):
        explicit = {
            n.name for n in group if override(n, options.opcode, options.opname, options.comply)[1]
        }
        on_cpu = [n.name for n in group if pinned.get(n.name) == CPU]
        firm_cpu = [name for name in on_cpu if name in explicit] or on_cpu
        firm_accel = [n.name for n in group if pinned.get(n.name) == accel and n.name in explicit]
        if firm_accel and set(firm_cpu) & explicit:
            raise UserError(
                f"partition: nodes '{firm_accel[0]}' (mapped to {accel}) and '{firm_cpu[0]}' "
                "(mapped to cpu) share values quantized per channel, which never cross "
                "backends; map them to one backend, or quantize with activation_granularity = "
                '"tensor"'
            )
        if firm_accel:  # blanket CPU mappings give way to an explicit NPU one
            for name in on_cpu:
                pinned.pop(name)
            continue
        for node in group if on_cpu else ():
            if pinned.get(node.name) != CPU:
                pinned.pop(node.name, None)
                reasons[node.name] = [
                    *reasons[node.name],
                    f"its values quantized per channel tie it to node '{firm_cpu[0]}', which "
                    "the partition maps place on cpu",
                ]


def _cost(graph, name, options, cpu, reasons, pinned, baseline, latency_of):
    """The minimum-latency placement and the lines that explain it; `baseline` is the
    capability placement, its parts and its latency."""
    accel = options.accelerator
    capability, base, base_latency = baseline
    npu_us = {}
    for part in base.parts:
        if part.backend == accel:
            estimate = latency_of.npu_estimate(part.graph)
            scale = estimate["microseconds"] / max(estimate["cycles"], 1)
            for layer, info in estimate["layers"].items():
                npu_us[layer] = info["cycles"] * scale

    def cost(node, on_accel: bool) -> float:
        if on_accel:
            return npu_us.get(node.name, 0.0) if not reasons[node.name] else float("inf")
        return cpu.node_us(node)

    fixed = {n: b == accel for n, b in pinned.items()}
    fixed.update({n.name: False for n in graph.nodes if reasons[n.name]})
    labels = min_cost(graph, cost, partial(_handoff, cpu), fixed)
    chosen = {n: accel if on else CPU for n, on in labels.items()}
    latency = latency_of(split(graph, chosen, name))
    improved = True
    while improved:  # parts that do not pay for their invocation go to the CPU
        improved = False
        for part in split(graph, chosen, name).parts:
            movable = [n.name for n in part.graph.nodes if n.name not in pinned]
            if part.backend != accel or len(movable) != len(part.graph.nodes):
                continue
            trial = {**chosen, **dict.fromkeys(movable, CPU)}
            trial_latency = latency_of(split(graph, trial, name))
            if trial_latency["microseconds"] < latency["microseconds"]:
                chosen, latency, improved = trial, trial_latency, True
                break
    lines = [
        f"capability: {base_latency['microseconds']:.1f} us in {len(base.parts)} parts; "
        f"minimum-cost: {latency['microseconds']:.1f} us in {len(latency['parts'])} parts"
    ]
    if base_latency["microseconds"] <= latency["microseconds"]:
        lines.append("kept the capability partition (not slower by the estimate)")
        return capability, base_latency, lines
    moved = sorted(n for n in chosen if chosen[n] != capability[n])
    lines.append(f"moved {len(moved)} supported node(s) to the CPU: " + ", ".join(moved[:10]))
    return chosen, latency, lines


NEVER = 1e30  # a handoff the minimum cut must not make


def _handoff(cpu: HostCpu, value: Value) -> float:
    """Handing `value` between backends; a value quantized per channel is never handed over
    (accelerator programs take and give values quantized per tensor)."""
    return NEVER if per_channel_value(value) else cpu.handoff(value)


class _Latency:
    """Estimated end-to-end time of running parts one after another, with handoffs. NPU
    estimates are kept per part content (the cost search re-splits the same regions often)."""

    def __init__(self, target: Target, hw: str, cpu: HostCpu):
        self.target, self.hw, self.cpu = target, hw, cpu
        self.estimates: dict[tuple[str, ...], dict] = {}

    def npu_estimate(self, graph: Graph) -> dict:
        key = tuple(n.name for n in graph.nodes)
        if key not in self.estimates:
            self.estimates[key] = self.target.estimate(graph, self.hw)
        return self.estimates[key]

    def __call__(self, partitioning: Partitioning) -> dict:
        """Total, handoffs and per part: its time (an NPU part's with its invocation,
        `invoke_us`) and the handoffs charged to it (`handoff_us`: an edge between backends
        to its NPU side, a model input or output to the NPU part that takes or gives it)."""
        cpu, parts = self.cpu, []
        backends = [p.backend for p in partitioning.parts]
        for index, part in enumerate(partitioning.parts):
            entry = {"model": index, "backend": part.backend, "handoff_us": 0.0}
            if part.backend == CPU:
                entry["microseconds"] = cpu.graph_us(part.graph)
            else:
                npu = self.npu_estimate(part.graph)["microseconds"]
                entry["microseconds"] = npu + cpu.npu_invoke_us
                entry["invoke_us"] = cpu.npu_invoke_us
            parts.append(entry)
        for edge in partitioning.edges:
            source = backends[edge.source[0]]
            across = [m for m, _ in edge.targets if backends[m] != source]
            if across:
                graph = partitioning.parts[edge.source[0]].graph
                side = edge.source[0] if source != CPU else across[0]
                parts[side]["handoff_us"] += cpu.handoff(graph.outputs[edge.source[1]])
        for refs, side in ((partitioning.inputs, "inputs"), (partitioning.outputs, "outputs")):
            for m, i in refs:
                if backends[m] != CPU:
                    value = getattr(partitioning.parts[m].graph, side)[i]
                    parts[m]["handoff_us"] += cpu.handoff(value)
        handoffs = sum(p["handoff_us"] for p in parts)
        total = sum(p["microseconds"] for p in parts) + handoffs
        for entry in parts:
            entry["microseconds"] = round(entry["microseconds"], 3)
            entry["handoff_us"] = round(entry["handoff_us"], 3)
        return {"microseconds": round(total, 3), "handoffs": round(handoffs, 3), "parts": parts}


def mac_share(graph: Graph, backend_of: dict[str, str]) -> dict[str, int]:
    """Multiply-accumulates of the convolutions and matrix products per backend."""
    totals: dict[str, int] = {}
    for node in graph.nodes:
        if macs(node):
            backend = backend_of[node.name]
            totals[backend] = totals.get(backend, 0) + macs(node)
    return totals


def report_lines(name: str, report: dict) -> list[str]:
    """The partition report as a short console table: parts and nodes per backend with their
    share of the MACs, then the CPU fallback reasons with the number of nodes each."""
    macs_of = report["macs"]
    total = max(sum(macs_of.values()), 1)
    backends = sorted({p["backend"] for p in report["parts"]}, key=lambda b: (b == CPU, b))
    lines = [
        f"partition '{name}' ({report['strategy']}, {report['hardware']}): "
        f"{len(report['parts'])} part(s), {sum(macs_of.values()) / 1e6:.1f} M MACs",
        f"  {'backend':<8} {'parts':>5} {'nodes':>6} {'MACs':>7}",
    ]
    for backend in backends:
        parts = [p for p in report["parts"] if p["backend"] == backend]
        share = 100 * macs_of.get(backend, 0) / total
        nodes = sum(p["nodes"] for p in parts)
        lines.append(f"  {backend:<8} {len(parts):>5} {nodes:>6} {share:>6.1f}%")
    counts: dict[str, int] = {}
    for fallback in report["fallbacks"]:
        for why in fallback["reasons"]:
            counts[why] = counts.get(why, 0) + 1
    if counts:
        lines.append("  CPU fallback reasons (nodes with each; a node may have several):")
        for why, count in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
            lines.append(f"  {count:>6}  {why}")
    if report.get("hint"):
        lines.append(f"  {report['hint']}")
    return lines
