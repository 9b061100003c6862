"""`backend = auto`: which gated model an app runs, by the host's and the target's cost models."""

from ..graph_ir.ir import Graph
from ..targets.host_cpu import HostCpu

STATES = ("INITIAL", "QUANTIZED", "COMPILED")


def choose_state(
    float_graph: Graph, quantized_graph: Graph, gates: dict, requirement: str
) -> tuple[str, dict]:
    """The best candidate for `requirement` ("performance": fewest estimated microseconds,
    "memory": fewest bytes) among the float model and the models whose gate passed, the later
    state winning ties; and the record of the choice (requirement, chosen, estimates)."""
    cpu = HostCpu()
    candidates = {"INITIAL": (cpu.graph_us(float_graph), cpu.memory_bytes(float_graph))}
    if gates.get("quantized", {}).get("passed"):
        candidates["QUANTIZED"] = (cpu.graph_us(quantized_graph), cpu.memory_bytes(quantized_graph))
    compiled = gates.get("compiled", {})
    if compiled.get("passed"):
        candidates["COMPILED"] = (compiled["microseconds"], compiled["memory_bytes"])
    key = 0 if requirement == "performance" else 1
    best = min(candidates, key=lambda s: (candidates[s][key], -STATES.index(s)))
    estimates = {
        s: {"microseconds": round(us, 1), "memory_bytes": int(mem)}
        for s, (us, mem) in candidates.items()
    }
    return best, {"requirement": requirement, "chosen": best, "estimates": estimates}
