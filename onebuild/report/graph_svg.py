"""The model graph as inline SVG: nodes coloured by part and backend, CPU fallbacks with reasons.

The layout is a small layered (Sugiyama-style) one written here: layers by longest path from
the inputs, order within a layer by barycentre sweeps. Graphviz would draw better but needs its
`dot` binary, which PyPI does not ship; networkx has no crossing reduction for DAGs. Models in
a report are drawn top to bottom, one node per row band, which reads well up to a few hundred
nodes (bigger graphs are drawn too, only taller).
"""

from dataclasses import dataclass
from html import escape
from pathlib import Path

from ..graph_ir.serde import load_ir
from .figure import clip

NODE_W, NODE_H, GAP_X, GAP_Y, MARGIN, NOTE_GAP, CHAR_W = 190, 24, 24, 18, 12, 120, 6.2
LANE_GAP, PADDING = 6, 6  # between edges routed beside the boxes; text inside a box
LABEL_CHARS = int((NODE_W - 2 * PADDING) / 7.0)  # wide letters (capitals) included
NPU_COLOURS = ("#9ecae9", "#a6dba0", "#c6dbef", "#b8e0d2", "#d9f0a3")
CPU_COLOURS = ("#fdbf6f", "#fb9a99", "#fee391", "#f4cae4", "#fdd0a2")


@dataclass
class _Node:
    name: str
    op: str
    part: int  # index into the parts list
    inputs: list[str]
    outputs: list[str]
    layer: int = 0
    x: float = 0.0


def part_colours(backends: list[str]) -> list[str]:
    """One fill per part: NPU parts in blues and greens, CPU parts in oranges and reds."""
    counts, colours = {"npu": 0, "cpu": 0}, []
    for backend in backends:
        palette = NPU_COLOURS if backend == "npu" else CPU_COLOURS
        colours.append(palette[counts[backend] % len(palette)])
        counts[backend] += 1
    return colours


def graph_svg(parts: list[tuple[str, str, Path]], reasons: dict[str, list[str]]) -> str:
    """The nodes of every part (label, backend, IR file) joined by the values they share."""
    nodes = [
        _Node(
            n.name or f"{n.op}#{i}",
            n.op,
            index,
            [v.name for v in n.inputs if v is not None and not v.is_const],
            [v.name for v in n.outputs],
        )
        for index, (_, _, path) in enumerate(parts)
        for i, n in enumerate(load_ir(path).main.nodes)
    ]
    producer = {value: k for k, node in enumerate(nodes) for value in node.outputs}
    edges = sorted(
        {(producer[v], k) for k, node in enumerate(nodes) for v in node.inputs if v in producer}
    )
    rows = _layers(nodes, edges)
    colours = part_colours([backend for _, backend, _ in parts])
    notes = [_note(nodes, row, reasons) for row in rows]
    notes_x = max(len(r) for r in rows) * (NODE_W + GAP_X) + MARGIN + NOTE_GAP
    lanes = _lanes(nodes, rows, edges)
    notes_x += LANE_GAP * len(set(lanes.values()))
    width = int(notes_x + max((len(n[1]) for n in notes if n), default=0) * CHAR_W + MARGIN)
    height = len(rows) * (NODE_H + GAP_Y) + 2 * MARGIN
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="graph" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" '
        'font-size="11">'
    ]
    for a, b in edges:
        out.append(_edge_svg(nodes[a], nodes[b], lanes.get((a, b))))
    for node in nodes:
        out.append(_node_svg(node, parts, colours, reasons.get(node.name)))
    for note in notes:
        if note:
            (x, y), text = note
            out.append(
                f'<line x1="{x:.1f}" y1="{y:.1f}" x2="{notes_x - 4:.1f}" y2="{y:.1f}" '
                f'stroke="#c66" stroke-dasharray="2 3"/><text x="{notes_x:.1f}" '
                f'y="{y + 4:.1f}" fill="#a33">{escape(text)}</text>'
            )
    out.append("</svg>")
    return "\n".join(out)


def _layers(nodes: list[_Node], edges: list[tuple[int, int]]) -> list[list[int]]:
    """Longest-path layers (nodes are in topological order within a part and parts run in
    order), then two barycentre sweeps to reduce crossings; sets each node's layer and x."""
    preds: dict[int, list[int]] = {k: [] for k in range(len(nodes))}
    succs: dict[int, list[int]] = {k: [] for k in range(len(nodes))}
    for a, b in edges:
        preds[b].append(a)
        succs[a].append(b)
    for k in _topological(len(nodes), preds, succs):
        nodes[k].layer = max((nodes[p].layer + 1 for p in preds[k]), default=0)
    rows: list[list[int]] = [[] for _ in range(max((n.layer for n in nodes), default=0) + 1)]
    for k, node in enumerate(nodes):
        rows[node.layer].append(k)
    for neighbours, order in ((preds, rows), (succs, rows[::-1]), (preds, rows)):
        for row in order:
            for position, k in enumerate(row):
                nodes[k].x = position
            row.sort(key=lambda k, nb=neighbours: _barycentre(nodes, nb[k], nodes[k].x))
            for position, k in enumerate(row):
                nodes[k].x = position
    widest = max(len(r) for r in rows)
    for row in rows:
        shift = (widest - len(row)) / 2
        for k in row:
            nodes[k].x += shift
    return rows


def _topological(count: int, preds: dict, succs: dict) -> list[int]:
    """Kahn's order, lowest index first (parts are acyclic and connected in order)."""
    waiting = {k: len(set(preds[k])) for k in range(count)}
    ready = sorted(k for k, n in waiting.items() if n == 0)
    order = []
    while ready:
        k = ready.pop(0)
        order.append(k)
        for s in sorted(set(succs[k])):
            waiting[s] -= 1
            if waiting[s] == 0:
                ready.append(s)
        ready.sort()
    return order


def _barycentre(nodes: list[_Node], neighbours: list[int], default: float) -> float:
    return sum(nodes[n].x for n in neighbours) / len(neighbours) if neighbours else default


def _lanes(nodes: list[_Node], rows: list[list[int]], edges) -> dict[tuple, float]:
    """The x of the vertical run of each edge that skips layers (a residual Add's input, an SE
    block's Mul): right of every box in the layers it passes, edges that overlap in their
    layers on lanes LANE_GAP apart."""
    lanes: dict[tuple, float] = {}
    taken: list[tuple[float, int, int]] = []  # (x, first layer, last layer) of each lane run
    for a, b in sorted(edges, key=lambda e: (nodes[e[0]].layer, nodes[e[1]].layer)):
        first, last = nodes[a].layer + 1, nodes[b].layer - 1
        if last < first:
            continue
        right = max(_centre(nodes[k])[0] for row in rows[first : last + 1] for k in row)
        x = right + NODE_W / 2 + GAP_X / 2
        while any(abs(x - t) < 1 and lo <= last and first <= hi for t, lo, hi in taken):
            x += LANE_GAP
        taken.append((x, first, last))
        lanes[(a, b)] = x
    return lanes


def _edge_svg(source: _Node, target: _Node, lane: float | None) -> str:
    """An edge from the bottom of `source` to the top of `target`: a curve between adjacent
    layers; an edge that skips layers runs in the gaps between rows and at `lane`, beside the
    boxes of the layers between (not through them)."""
    (x1, y1), (x2, y2) = _centre(source), _centre(target)
    y1, y2 = y1 + NODE_H / 2, y2 - NODE_H / 2
    if lane is None:
        bend = GAP_Y * 1.5
        path = (
            f"M{x1:.1f},{y1:.1f} C{x1:.1f},{y1 + bend:.1f} {x2:.1f},{y2 - bend:.1f} "
            f"{x2:.1f},{y2:.1f}"
        )
    else:
        below, above = y1 + GAP_Y / 2, y2 - GAP_Y / 2
        path = f"M{x1:.1f},{y1:.1f} V{below:.1f} H{lane:.1f} V{above:.1f} H{x2:.1f} V{y2:.1f}"
    return f'<path d="{path}" fill="none" stroke="#999" stroke-width="1"/>'


def _centre(node: _Node) -> tuple[float, float]:
    x = MARGIN + node.x * (NODE_W + GAP_X) + NODE_W / 2
    y = MARGIN + node.layer * (NODE_H + GAP_Y) + NODE_H / 2
    return x, y


def _node_svg(node: _Node, parts, colours: list[str], reasons: list[str] | None) -> str:
    """A node box with its op and name (dashed for a CPU fallback, whose reason shows when
    hovered)."""
    cx, cy = _centre(node)
    x, y = cx - NODE_W / 2, cy - NODE_H / 2
    label = parts[node.part][0]
    why = f": {'; '.join(reasons)}" if reasons else ""
    title = escape(f"{node.name} ({node.op}), {label}{why}")
    text = escape(f"{node.op} {clip(node.name, max(LABEL_CHARS - 1 - len(node.op), 8))}")
    dash = ' stroke-dasharray="4 2"' if reasons else ""
    svg = (
        f'<g><title>{title}</title><rect x="{x:.1f}" y="{y:.1f}" width="{NODE_W}" '
        f'height="{NODE_H}" rx="4" fill="{colours[node.part]}" stroke="#333"{dash}/>'
        f'<svg x="{x + PADDING:.1f}" y="{y:.1f}" width="{NODE_W - 2 * PADDING}" '
        f'height="{NODE_H}"><text x="0" y="{NODE_H / 2 + 4:.1f}" fill="#111">{text}</text></svg>'
    )  # a nested svg clips what a name of wide letters would draw past the box
    return svg + "</g>"


def _note(nodes: list[_Node], row: list[int], reasons: dict) -> tuple | None:
    """((x, y) where its leader starts, text): the fallback reasons of one layer's nodes."""
    fallen = [nodes[k] for k in row if nodes[k].name in reasons]
    if not fallen:
        return None
    cx, cy = _centre(max(fallen, key=lambda n: n.x))
    texts = ["; ".join(reasons[n.name]) for n in fallen]
    if len(fallen) > 1:
        texts = [f"{n.op}: {t}" for n, t in zip(fallen, texts)]
    return (cx + NODE_W / 2, cy), " | ".join(texts)
