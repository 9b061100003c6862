"""The report's end-to-end latency: the partition's estimate per part (compute, the NPU's
invocation, the CPU<->NPU handoffs charged to it) beside what the simulator measured for each
compiled NPU part, with the same invocation and handoffs added, so the two totals compare."""

from html import escape

import numpy as np

from ..targets.host_cpu import HostCpu
from .collect import Binary, BuildData


def latency_section(data: BuildData, table) -> str:
    """'<h3>End-to-end latency</h3>' and its table (`table`: the page's table writer); empty
    without a partition estimate or a compiled binary."""
    estimate = (data.partition or {}).get("estimate")
    simulated = {_stem(b.name): b for b in data.binaries if b.microseconds is not None}
    if estimate and "handoff_us" in (estimate["parts"] or [{}])[0]:
        return _partitioned(data, estimate, simulated, table)
    if len(data.binaries) == 1 and not data.partition and simulated:
        return _whole(data.binaries[0])
    return ""


def _stem(name: str) -> str:
    return name.rsplit("/", 1)[-1].rsplit(".", 1)[0]


def _partitioned(data: BuildData, estimate: dict, simulated: dict[str, Binary], table) -> str:
    rows, measured, complete = [], 0.0, True
    files = [part["file"] for part in data.partition["parts"]]
    for part in estimate["parts"]:
        stem = _stem(files[part["model"]])
        invoke = part.get("invoke_us", 0.0)
        binary = simulated.get(stem)
        if part["backend"] == "cpu":
            sim = part["microseconds"]  # the CPU is not simulated: its estimate stands
        elif binary is None:
            sim, complete = None, False
        else:
            sim = binary.microseconds + invoke
        if sim is not None:
            measured += sim + part["handoff_us"]
        rows.append(
            [escape(stem), escape(part["backend"]), _us(part["microseconds"] - invoke),
             _us(invoke) if invoke else "", _us(part["handoff_us"]),
             _us(part["microseconds"] + part["handoff_us"]),
             "" if binary is None else _us(binary.microseconds),
             "" if sim is None else _us(sim + part["handoff_us"])]
        )  # fmt: skip
    total = estimate["microseconds"]
    rows.append(
        ["<b>end to end</b>", "", "", "", _us(estimate["handoffs"]), _us(total), "",
         _us(measured) if complete else "not every NPU part compiled"]
    )  # fmt: skip
    header = ["part", "backend", "compute (est.)", "NPU invocation", "handoffs", "estimate",
              "NPU simulated", "with simulation"]  # fmt: skip
    npu = [p for p in estimate["parts"] if p["backend"] != "cpu"]
    invoke = npu[0].get("invoke_us", 0.0) if npu else 0.0
    return (
        "<h3>End-to-end latency</h3>"
        f"<p>Estimated {total / 1000:.3f} ms for one inference in {len(rows) - 1} parts, "
        f"{estimate['handoffs']:.0f} us of it CPU&lt;-&gt;NPU handoffs and "
        f"{invoke * len(npu):.0f} us NPU invocations ({len(npu)} x {invoke:g} us, a host-side "
        "driver cost the simulator does not model)"
        + (f"; {measured / 1000:.3f} ms with the NPU parts as simulated" if complete else "")
        + ". <i>compute (est.)</i> is the TRIX performance model's or the host CPU model's "
        "time; <i>NPU simulated</i> is the simulator's cycles of the compiled part; "
        "<i>with simulation</i> adds the same invocation and handoffs to it (CPU parts keep "
        "their estimate).</p>" + table(header, rows, set(range(2, 8))) + _hint(data.partition)
    )


def _hint(partition: dict) -> str:
    """The partitioner's line when the cost strategy is estimated 10 % faster or more."""
    hint = partition.get("hint")
    return f'<p class="stale">{escape(hint)}.</p>' if hint else ""


def _whole(binary: Binary) -> str:
    """One binary of the whole model: simulated, plus one invocation and its I/O handoffs."""
    cpu = HostCpu()
    tensors = [*binary.info.get("inputs", []), *binary.info.get("outputs", [])]
    handoffs = sum(
        cpu.handoff_bytes(int(np.prod(t["dims"])) * np.dtype(t["dtype"]).itemsize) for t in tensors
    )
    total = binary.microseconds + cpu.npu_invoke_us + handoffs
    return (
        "<h3>End-to-end latency</h3>"
        f"<p>{total:.1f} us for one inference: {binary.microseconds:.1f} us simulated on the NPU, "
        f"{cpu.npu_invoke_us:g} us invocation (host-side driver cost) and {handoffs:.1f} us for "
        f"handing its {len(tensors)} inputs and outputs between the CPU and the NPU "
        f"({cpu.name} model).</p>"
    )


def _us(value: float) -> str:
    return f"{value:.1f}"
