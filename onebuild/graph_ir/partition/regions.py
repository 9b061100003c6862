"""Backend assignment -> acyclic regions -> standalone part graphs and their connections.

`group` merges nodes of the same backend along data edges into the largest regions that create
no cycle between regions (a merge is refused when a path leaves the merged set and comes back).
`split` turns the regions into standalone graphs, ordered so each part only reads the package
inputs and outputs of earlier parts, and records every tensor crossing a cut as an edge
`(model, output index) -> [(model, input index), ...]`, as nnpackage's model-connect does.
"""

from dataclasses import dataclass, field

from ..ir import Graph, IRError, Node, Value


@dataclass
class Part:
    backend: str
    graph: Graph


@dataclass(frozen=True)
class Edge:
    tensor: str
    source: tuple[int, int]  # (part, output index)
    targets: tuple[tuple[int, int], ...]  # (part, input index) each


@dataclass
class Partitioning:
    """Parts in execution order; where each source input goes and each source output comes from."""

    parts: list[Part]
    inputs: list[tuple[int, int]]  # per source input: (part, input index)
    outputs: list[tuple[int, int]]  # per source output: (part, output index)
    edges: list[Edge] = field(default_factory=list)


def _producers(node: Node) -> list[Node]:
    found = {id(v.producer): v.producer for v in node.inputs if v is not None and v.producer}
    return list(found.values())


def _consumers(node: Node) -> list[Node]:
    return list({id(u): u for v in node.outputs for u in v.users}.values())


def group(graph: Graph, backend_of: dict[str, str]) -> list[list[Node]]:
    """Regions of same-backend nodes (each in graph order), in a valid execution order."""
    nodes = graph.nodes
    position = {id(n): i for i, n in enumerate(nodes)}
    parent = list(range(len(nodes)))
    members = {i: {i} for i in range(len(nodes))}

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def creates_cycle(merged: set[int]) -> bool:
        """Whether a path leaves `merged` and re-enters it (positions only grow along paths)."""
        last = max(merged)
        stack = [
            position[id(c)]
            for i in merged
            for c in _consumers(nodes[i])
            if position[id(c)] not in merged and position[id(c)] < last
        ]
        seen = set(stack)
        while stack:
            for c in _consumers(nodes[stack.pop()]):
                p = position[id(c)]
                if p in merged:
                    return True
                if p < last and p not in seen:
                    seen.add(p)
                    stack.append(p)
        return False

    for v, node in enumerate(nodes):
        for producer in sorted(_producers(node), key=lambda n: -position[id(n)]):
            u = position[id(producer)]
            a, b = find(u), find(v)
            if a == b or backend_of[producer.name] != backend_of[node.name]:
                continue
            merged = members[a] | members[b]
            if not creates_cycle(merged):
                parent[b] = a
                members[a] = merged
                del members[b]
    regions = [sorted(m) for m in members.values()]

    def backend(region: list[int]) -> str:
        return backend_of[nodes[region[0]].name]

    runs: list[list[int]] = []
    for region in _execution_order(nodes, position, regions, find, backend):
        if runs and backend(runs[-1]) == backend(region):  # neighbours merge without cycles
            runs[-1] = sorted(runs[-1] + region)
        else:
            runs.append(region)
    return [[nodes[i] for i in region] for region in runs]


def _execution_order(nodes, position, regions: list[list[int]], find, backend) -> list[list[int]]:
    """Regions sorted topologically; among the ready ones, the backend of the previous region
    first (so neighbours can merge), then the earliest node."""
    root_of = {i: find(i) for region in regions for i in region}
    by_root = {find(region[0]): region for region in regions}
    after: dict[int, set[int]] = {root: set() for root in by_root}
    for i, node in enumerate(nodes):
        for producer in _producers(node):
            a, b = root_of[position[id(producer)]], root_of[i]
            if a != b:
                after[b].add(a)
    order, done = [], set()
    while len(order) < len(by_root):
        ready = [r for r in by_root if r not in done and after[r] <= done]
        if not ready:
            raise IRError("partitioning produced a cycle between regions")
        last = backend(order[-1]) if order else None
        first = min(ready, key=lambda r: (backend(by_root[r]) != last, by_root[r][0]))
        done.add(first)
        order.append(by_root[first])
    return order


def split(graph: Graph, backend_of: dict[str, str], name: str) -> Partitioning:
    """Standalone graphs for the regions of `graph` under `backend_of` (node name -> backend)."""
    regions = group(graph, backend_of)
    owner = {id(n): k for k, region in enumerate(regions) for n in region}
    graph_outputs = {id(v) for v in graph.outputs}
    readers: dict[int, list[int]] = {}  # value id -> parts that read it, in order
    for k, region in enumerate(regions):
        for node in region:
            for v in node.inputs:
                if v is not None and not v.is_const and k not in readers.setdefault(id(v), []):
                    readers[id(v)].append(k)
    parts, part_inputs, part_outputs = [], [], []
    passed = [v for v in graph.inputs if id(v) in graph_outputs]  # inputs that are outputs too
    if passed:  # a first CPU part without nodes hands them on, as outputs of the same name
        part = Graph(f"{name}.00001_cpu")
        for v in passed:
            part.add_input(v.name, v.dtype, v.shape).quant = v.quant
        part.outputs = list(part.inputs)
        parts.append(Part("cpu", part))
        part_inputs.append(passed)
        part_outputs.append(passed)
    first = len(parts) + 1  # the number of the first region's part
    for k, region in enumerate(regions):
        ins = _region_inputs(region, owner, k)
        outs = [
            v
            for node in region
            for v in node.outputs
            if id(v) in graph_outputs or any(r != k for r in readers.get(id(v), []))
        ]
        # a package input read by several parts enters the first; later parts read a copy of it
        relay = [
            v
            for v in ins
            if v.producer is None
            and id(v) not in graph_outputs  # the first part hands those on
            and readers[id(v)][0] == k < readers[id(v)][-1]
        ]
        number = f"{k + first:05d}_{backend_of[region[0].name]}"
        part = _extract(region, ins, outs, relay, f"{name}.{number}")
        parts.append(Part(backend_of[region[0].name], part))
        part_inputs.append(ins)
        part_outputs.append(outs + relay)
    where = {}  # value id -> (part, output index)
    for k, outs in enumerate(part_outputs):
        for index, v in enumerate(outs):
            where.setdefault(id(v), (k, index))
    targets: dict[int, list[tuple[int, int]]] = {}
    inputs: list[tuple[int, int]] = []
    for v in graph.inputs:
        first = next(((k, ins.index(v)) for k, ins in enumerate(part_inputs) if v in ins), None)
        if first is None:
            raise IRError(f"graph input '{v.name}' is not read by any node")
        inputs.append(first)
    for k, ins in enumerate(part_inputs):
        for index, v in enumerate(ins):
            if (k, index) not in inputs:
                targets.setdefault(id(v), []).append((k, index))
    edges = []
    for k, outs in enumerate(part_outputs):
        for index, v in enumerate(outs):
            if id(v) in targets and where[id(v)] == (k, index):
                edges.append(Edge(v.name, (k, index), tuple(targets.pop(id(v)))))
    outputs = []
    for v in graph.outputs:
        if id(v) not in where:
            raise IRError(f"graph output '{v.name}' is not computed by any node")
        outputs.append(where[id(v)])
    return Partitioning(parts, inputs, outputs, edges)


def _region_inputs(region: list[Node], owner: dict[int, int], k: int) -> list[Value]:
    found: dict[int, Value] = {}
    for node in region:
        for v in node.inputs:
            if v is None or v.is_const:
                continue
            if v.producer is None or owner[id(v.producer)] != k:
                found.setdefault(id(v), v)
    return list(found.values())


def _extract(region: list[Node], ins: list[Value], outs: list[Value], relay, name: str) -> Graph:
    """A standalone copy of `region`: same value and node names, types and quantization."""
    part = Graph(name)
    copies: dict[int, Value] = {}
    for v in ins:
        new = part.add_input(v.name, v.dtype, v.shape)
        new.quant = v.quant
        copies[id(v)] = new
    for node in region:
        inputs = []
        for v in node.inputs:
            if v is not None and v.is_const and id(v) not in copies:
                copies[id(v)] = part.add_constant(v.const, v.name)
                copies[id(v)].quant = v.quant
            inputs.append(None if v is None else copies[id(v)])
        new = part.make_node(
            node.op, inputs, node.attrs, node.name, output_names=[v.name for v in node.outputs]
        )
        for old, value in zip(node.outputs, new.outputs):
            if value.name != old.name or value.type != old.type:
                raise IRError(f"node '{node.name}': its copy changed '{old.name}'")
            value.quant = old.quant
            copies[id(old)] = value
    part.outputs = [copies[id(v)] for v in outs]
    for v in relay:
        copy = part.make_node("Identity", [copies[id(v)]], name=f"{v.name}/relay").output
        copy.quant = v.quant
        part.outputs.append(copy)
    return part


def ref(model: int, io: int) -> str:
    """nnpackage's "model:subgraph:io" reference (parts have one subgraph)."""
    return f"{model}:0:{io}"


def connection_info(partitioning: Partitioning, source: Graph, files: list[str]) -> dict:
    """The connection JSON of ONE's spec discussion: `source` inputs/outputs and `conn` edges as
    "model:subgraph:io" references, with the parts' files and tensor names kept for humans."""
    parts = partitioning.parts
    return {
        "source": {
            "inputs": [ref(*r) for r in partitioning.inputs],
            "outputs": [ref(*r) for r in partitioning.outputs],
            "input_names": [v.name for v in source.inputs],
            "output_names": [v.name for v in source.outputs],
        },
        "parts": [
            {
                "file": file,
                "backend": part.backend,
                "inputs": [v.name for v in part.graph.inputs],
                "outputs": [v.name for v in part.graph.outputs],
            }
            for file, part in zip(files, parts)
        ],
        "conn": [
            {"from": ref(*e.source), "to": [ref(*t) for t in e.targets], "tensor": e.tensor}
            for e in partitioning.edges
        ],
    }
