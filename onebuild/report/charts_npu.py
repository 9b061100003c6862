"""NPU pictures from what a target reports about one inference of a binary: the per-layer
timeline (each layer's share of the cycles, and its compute and DMA engine busy time) and a
roofline chart (attained MACs per cycle against arithmetic intensity)."""

import numpy as np

from .collect import Binary
from .figure import clip, figure, svg_text

WIDTH = 8.0  # inches
BUSY = ("#2f4b7c", "#f28e2b")  # compute, DMA: colours no layer kind has
PALETTE = ("#4e79a7", "#59a14f", "#edc948", "#b07aa1", "#76b7b2", "#ff9da7", "#9c755f", "#bab0ac")


def timeline_chart(binary: Binary, index: int) -> str:
    """Top: the layers one after another, each as long as its share of the cycles. Bottom:
    per layer, compute and DMA busy cycles (they overlap when tiles are double-buffered).
    The legend is the figure's, below the axes, in as many rows as its entries need, read row
    by row (a legend beside or above an axes takes its width from it under constrained
    layout)."""
    from matplotlib.patches import Patch  # matplotlib only once the report is drawn

    layers = list(binary.info["layers_table"].items())
    names = [name for name, _ in layers]
    kinds = sorted({str(layer.get("kind", "?")) for _, layer in layers})
    colours = {kind: PALETTE[i % len(PALETTE)] for i, kind in enumerate(kinds)}
    columns = _legend_columns([*kinds, "compute busy", "DMA busy"], WIDTH)
    rows = -(-(len(kinds) + 2) // columns)
    height = 2.4 + 0.22 * len(layers) + 0.2 * rows
    with figure(f"timeline{index}", WIDTH, height) as fig:
        top, bottom = fig.subplots(2, 1, height_ratios=[1, max(1.6, len(layers) * 0.3)])
        start = 0
        for name, layer in layers:
            colour = colours[str(layer.get("kind", "?"))]
            top.barh(0, layer["cycles"], left=start, color=colour, edgecolor="white")
            if layer["cycles"] > binary.info["cycles"] * 0.06:
                top.text(start + layer["cycles"] / 2, 0, clip(name, 12), ha="center",
                         va="center", fontsize=7, color="white")  # fmt: skip
            start += layer["cycles"]
        top.set_yticks([])
        top.set_xlim(0, max(start, 1))
        top.set_xlabel("cycles (one inference)")
        info = binary.info
        fig.suptitle(
            f"{binary.name}: {info['cycles']} cycles, {info.get('milliseconds')} ms on "
            f"{info.get('hardware')}"
        )
        y = np.arange(len(layers))[::-1]
        compute = [layer.get("compute_cycles", 0) for _, layer in layers]
        dma = [layer.get("dma_cycles", 0) for _, layer in layers]
        bottom.barh(y + 0.2, compute, height=0.4, color=BUSY[0])
        bottom.barh(y - 0.2, dma, height=0.4, color=BUSY[1])
        bottom.set_yticks(y, [clip(n, 28) for n in names])
        bottom.set_xlabel("engine busy cycles per layer")
        handles = [Patch(color=colours[kind]) for kind in kinds] + [Patch(color=c) for c in BUSY]
        labels = [*kinds, "compute busy", "DMA busy"]
        order = [i for column in range(columns) for i in range(column, len(labels), columns)]
        fig.legend([handles[i] for i in order], [labels[i] for i in order], ncols=columns,
                   loc="outside lower center", frameon=False)  # fmt: skip
        return svg_text(fig, f"timeline{index}")


def _legend_columns(labels: list[str], width: float) -> int:
    """How many legend entries fit side by side in `width` inches (9 pt text: about 0.075 in
    a character, plus the handle and the gaps)."""
    entry = 0.6 + 0.075 * max(len(label) for label in labels)
    return max(1, min(len(labels), int(width * 0.95 / entry)))


def roofline_points(binary: Binary) -> list[tuple[float, float]]:
    """(MACs per DRAM byte, attained MACs per cycle) of each layer that multiplies. A layer's
    time is the longest of its span on the timeline and its compute and DMA engines' busy
    cycles: in a cascade of SRAM row stripes a layer's work overlaps its neighbours', so its
    span alone can be far shorter than the work it does (SqueezeNet's n3: 1,090 cycles against
    6,050 busy), which would put it above the peak."""
    return [
        (
            layer["macs"] / max(layer["dram_bytes"], 1),
            layer["macs"] / max(_busy(layer), 1),
        )
        for layer in binary.info["layers_table"].values()
        if layer.get("macs")
    ]


def _busy(layer: dict) -> int:
    return max(layer["cycles"], layer.get("compute_cycles", 0), layer.get("dma_cycles", 0))


def roofline_chart(binaries: list[Binary]) -> str:
    """Each layer that multiplies (MACs > 0) as a point: MACs per DRAM byte against attained
    MACs per cycle (`roofline_points`); the roof is min(peak, intensity x DRAM bytes per cycle)
    of its hardware."""
    with figure("roofline", 7.0, 4.2) as fig:
        ax = fig.add_subplot()
        roofs = {}
        for index, binary in enumerate(binaries):
            points = roofline_points(binary)
            if points:
                x, y = zip(*points)
                ax.scatter(x, y, s=22, label=binary.name, marker="os^Dv<>p"[index % 8])
            names = [n for n, layer in binary.info["layers_table"].items() if layer.get("macs")]
            for name, point in zip(names, points):  # the same layers, in the same order
                ax.annotate(clip(name, 16), point, xytext=(4, 2), textcoords="offset points",
                            fontsize=6, color="#444")  # fmt: skip
            if binary.peak_macs and binary.bytes_per_cycle:
                roofs[binary.info.get("hardware")] = (binary.peak_macs, binary.bytes_per_cycle)
        for hardware, (peak, bandwidth) in sorted(roofs.items()):
            x = np.logspace(-2, 4, 200)
            ax.plot(x, np.minimum(peak, x * bandwidth), color="#333", linewidth=1)
            ax.text(1e4, peak, f"{hardware} peak {peak} MAC/cycle", ha="right", va="bottom")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("arithmetic intensity (MACs per DRAM byte)")
        ax.set_ylabel("attained MACs per cycle")
        ax.set_title("Roofline: NPU layers against the hardware's compute and DMA limits")
        ax.legend(loc="lower right", fontsize=7)
        return svg_text(fig, "roofline")
