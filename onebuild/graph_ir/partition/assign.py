"""Which backend runs each node: manual overrides and the minimum-cost two-backend labeling.

The cost labeling is exact for its model: node costs on either backend plus a transfer cost for
each tensor that crosses between backends (paid once per tensor, however many readers it has),
minimized by an s-t minimum cut (the labeling energy is submodular).
"""

from collections import deque
from collections.abc import Callable

from ...errors import UserError
from ..ir import Graph, Node, Value
from .op_keys import WILDCARD, float_ops, matches, specificity


def override(
    node: Node, opcode: dict[str, str], opname: dict[str, str], comply: str
) -> tuple[str | None, bool]:
    """(backend, explicit) that the manual maps give `node`: both maps apply and `comply` says
    which wins; a `_` key stands for every node the maps do not name (not explicit). Opcode
    keys are IR op or circle operator names (`op_keys`); of several naming the node the most
    specific wins, whatever their order, and equally specific ones must agree."""
    by_code = _by_opcode(node, opcode)
    by_name = opname.get(node.name) if node.name != WILDCARD else None
    first, second = (by_code, by_name) if comply == "opcode" else (by_name, by_code)
    if first or second:
        return first or second, True
    maps = (opcode, opname) if comply == "opcode" else (opname, opcode)
    return maps[0].get(WILDCARD) or maps[1].get(WILDCARD), False


def _by_opcode(node: Node, opcode: dict[str, str]) -> str | None:
    """The backend the most specific opcode keys naming `node` give it (`op_keys.specificity`:
    DEPTHWISE_CONV_2D over Conv); UserError when equally specific ones disagree."""
    ops = float_ops(node)
    hits = [(specificity(k), k, b) for k, b in opcode.items() if k != WILDCARD]
    hits = [hit for hit in hits if matches(hit[1], node, ops)]
    if not hits:
        return None
    top = max(level for level, _, _ in hits)
    chosen = sorted((k, b) for level, k, b in hits if level == top)
    if len({b for _, b in chosen}) > 1:
        keys = " and ".join(f"{k}={b}" for k, b in chosen)
        raise UserError(
            f"partition opcode keys {keys} name node '{node.name}' ({node.op}) with "
            "different backends: keep one, or pin the node by name (opname)"
        )
    return chosen[0][1]


def min_cost(
    graph: Graph,
    cost: Callable[[Node, bool], float],
    transfer: Callable[[Value], float],
    fixed: dict[str, bool],
) -> dict[str, bool]:
    """True for the nodes that should run on the accelerator.

    `cost(node, on_accel)` is a node's time on either side (inf where impossible), `transfer`
    the time to hand a tensor across, `fixed` pins nodes to a side. Graph inputs and outputs
    live on the host side.
    """
    nodes = graph.nodes
    flow = _MaxFlow(2 + len(nodes))
    source, sink = 0, 1  # source side = accelerator
    index = {id(n): 2 + i for i, n in enumerate(nodes)}
    big = 1e30
    for node in nodes:
        i = index[id(node)]
        pin = fixed.get(node.name)
        host = big if pin is True else cost(node, False)
        accel = big if pin is False else cost(node, True)
        flow.add(source, i, min(host, big))
        flow.add(i, sink, min(accel, big))
    outputs = {id(v) for v in graph.outputs}
    for value in [*graph.inputs, *(v for n in nodes for v in n.outputs)]:
        readers = [index[id(u)] for u in value.users]
        host_side = value.producer is None or id(value) in outputs
        if not readers and not host_side:
            continue
        t = transfer(value)
        producer = sink if value.producer is None else index[id(value.producer)]
        if id(value) in outputs:
            readers.append(sink)
        down = flow.add_node()  # pays t when the producer is on the accelerator, a reader not
        flow.add(producer, down, t)
        up = flow.add_node()  # pays t when a reader is on the accelerator, the producer not
        flow.add(up, producer, t)
        for reader in readers:
            flow.add(down, reader, big)
            flow.add(reader, up, big)
    accel = flow.source_side(source, sink)
    return {n.name: index[id(n)] in accel for n in nodes}


class _MaxFlow:
    """Dinic's maximum flow on a small dense-ish graph with float capacities."""

    def __init__(self, count: int):
        self.heads: list[list[int]] = [[] for _ in range(count)]
        self.to: list[int] = []
        self.cap: list[float] = []

    def add_node(self) -> int:
        self.heads.append([])
        return len(self.heads) - 1

    def add(self, a: int, b: int, capacity: float) -> None:
        if capacity <= 0 or a == b:
            return
        self.heads[a].append(len(self.to))
        self.to.append(b)
        self.cap.append(capacity)
        self.heads[b].append(len(self.to))
        self.to.append(a)
        self.cap.append(0.0)

    def _levels(self, s: int, t: int) -> list[int] | None:
        level = [-1] * len(self.heads)
        level[s] = 0
        queue = deque([s])
        while queue:
            a = queue.popleft()
            for e in self.heads[a]:
                if self.cap[e] > 1e-12 and level[self.to[e]] < 0:
                    level[self.to[e]] = level[a] + 1
                    queue.append(self.to[e])
        return level if level[t] >= 0 else None

    def _push(self, s: int, t: int, level: list[int], cursor: list[int]) -> float:
        """One augmenting path in the level graph (iterative DFS)."""
        path: list[int] = []
        a = s
        while True:
            if a == t:
                pushed = min(self.cap[e] for e in path)
                for e in path:
                    self.cap[e] -= pushed
                    self.cap[e ^ 1] += pushed
                return pushed
            heads = self.heads[a]
            while cursor[a] < len(heads):
                e = heads[cursor[a]]
                if self.cap[e] > 1e-12 and level[self.to[e]] == level[a] + 1:
                    break
                cursor[a] += 1
            else:
                if not path:
                    return 0.0
                level[a] = -1  # dead end
                e = path.pop()
                a = self.to[e ^ 1]
                cursor[a] += 1
                continue
            path.append(e)
            a = self.to[e]

    def source_side(self, s: int, t: int) -> set[int]:
        """Run the max flow; the nodes still reachable from `s` (the minimum cut's side)."""
        while (level := self._levels(s, t)) is not None:
            cursor = [0] * len(self.heads)
            while self._push(s, t, level, cursor) > 0:
                pass
        seen, queue = {s}, deque([s])
        while queue:
            a = queue.popleft()
            for e in self.heads[a]:
                if self.cap[e] > 1e-12 and self.to[e] not in seen:
                    seen.add(self.to[e])
                    queue.append(self.to[e])
        return seen
