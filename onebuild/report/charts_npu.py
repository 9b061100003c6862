"""NPU pictures from what a target reports about one inference of a binary: the per-layer
timeline (each layer's share of the cycles, and its compute and DMA engine busy time) and a
roofline chart (attained MACs per cycle against arithmetic intensity)."""

import numpy as np

from .collect import Binary
from .figure import clip, figure, svg_text

WIDTH = 8.0  # inches
BUSY = ("#2f4b7c", "#f28e2b")  # compute, DMA: colours no layer kind has
MAX_ROWS = 24  # layers drawn one per row in the busy chart; the rest summed in one row
PALETTE = ("#4e79a7", "#59a14f", "#edc948", "#b07aa1", "#76b7b2", "#ff9da7", "#9c755f", "#bab0ac")


def timeline_chart(binary: Binary, index: int) -> str:
    """Top: the layers one after another, each as long as its share of the cycles. Bottom:
    compute and DMA busy cycles (they overlap when tiles are double-buffered) of the MAX_ROWS
    busiest layers in execution order, the others summed in one last row, so the chart keeps
    its size on a model of hundreds of layers. The legend is the figure's, below the axes,
    in as many rows as its entries need, read row by row (a legend beside or above an axes
    takes its width from it under constrained layout)."""
    from matplotlib.patches import Patch  # matplotlib only once the report is drawn

    layers = list(binary.info["layers_table"].items())
    kinds = sorted({str(layer.get("kind", "?")) for _, layer in layers})
    colours = {kind: PALETTE[i % len(PALETTE)] for i, kind in enumerate(kinds)}
    columns = _legend_columns([*kinds, "compute busy", "DMA busy"], WIDTH)
    rows = -(-(len(kinds) + 2) // columns)
    names, compute, dma = busiest_rows(layers)
    height = 2.4 + 0.22 * len(names) + 0.2 * rows
    with figure(f"timeline{index}", WIDTH, height) as fig:
        top, bottom = fig.subplots(2, 1, height_ratios=[1, max(1.6, len(names) * 0.3)])
        starts = np.cumsum([0] + [layer["cycles"] for _, layer in layers])
        spans = [layer["cycles"] for _, layer in layers]
        top.barh(np.zeros(len(layers)), spans, left=starts[:-1], edgecolor="white",
                 color=[colours[str(layer.get("kind", "?"))] for _, layer in layers],
                 linewidth=0.5 if len(layers) < 60 else 0)  # fmt: skip
        for (name, layer), start in zip(layers, starts):
            if layer["cycles"] > binary.info["cycles"] * 0.06:
                top.text(start + layer["cycles"] / 2, 0, clip(name, 12), ha="center",
                         va="center", fontsize=7, color="white")  # fmt: skip
        top.set_yticks([])
        top.set_xlim(0, max(starts[-1], 1))
        top.set_xlabel("cycles (one inference)")
        info = binary.info
        fig.suptitle(
            f"{binary.name}: {info['cycles']} cycles, {info.get('milliseconds')} ms on "
            f"{info.get('hardware')}"
        )
        y = np.arange(len(names))[::-1]
        bottom.barh(y + 0.2, compute, height=0.4, color=BUSY[0])
        bottom.barh(y - 0.2, dma, height=0.4, color=BUSY[1])
        bottom.set_yticks(y, names)
        shown = f"the {MAX_ROWS} busiest of {len(layers)}" if len(layers) > len(names) else "per"
        bottom.set_xlabel(f"engine busy cycles ({shown} layer{'s' if shown != 'per' else ''})")
        handles = [Patch(color=colours[kind]) for kind in kinds] + [Patch(color=c) for c in BUSY]
        labels = [*kinds, "compute busy", "DMA busy"]
        order = [i for column in range(columns) for i in range(column, len(labels), columns)]
        fig.legend([handles[i] for i in order], [labels[i] for i in order], ncols=columns,
                   loc="outside lower center", frameon=False)  # fmt: skip
        return svg_text(fig, f"timeline{index}")


def busiest_rows(layers: list[tuple[str, dict]]) -> tuple[list[str], list[int], list[int]]:
    """(row names, compute, DMA busy cycles): every layer when there are at most MAX_ROWS + 1,
    else the MAX_ROWS busiest in execution order and a last row "N others" summing the rest."""
    busy = [max(layer.get("compute_cycles", 0), layer.get("dma_cycles", 0)) for _, layer in layers]
    keep = set(range(len(layers)))
    if len(layers) > MAX_ROWS + 1:
        keep = set(sorted(range(len(layers)), key=lambda i: (-busy[i], i))[:MAX_ROWS])
    names = [clip(layers[i][0], 28) for i in sorted(keep)]
    compute = [layers[i][1].get("compute_cycles", 0) for i in sorted(keep)]
    dma = [layers[i][1].get("dma_cycles", 0) for i in sorted(keep)]
    rest = [layer for i, (_, layer) in enumerate(layers) if i not in keep]
    if rest:
        names.append(f"{len(rest)} others")
        compute.append(sum(layer.get("compute_cycles", 0) for layer in rest))
        dma.append(sum(layer.get("dma_cycles", 0) for layer in rest))
    return names, compute, dma


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
    of its hardware. Points are named, the most MACs first, where a name fits without
    covering another name, the roof's label or the axes' edge (`_label_points`)."""
    with figure("roofline", 7.0, 4.2) as fig:
        ax = fig.add_subplot()
        roofs, named = {}, []
        for index, binary in enumerate(binaries):
            points = roofline_points(binary)
            if points:
                x, y = zip(*points)
                ax.scatter(x, y, s=22, label=clip(binary.name, 40), marker="os^Dv<>p"[index % 8])
            layers = [(n, la) for n, la in binary.info["layers_table"].items() if la.get("macs")]
            named += [(la["macs"], n, p) for (n, la), p in zip(layers, points)]  # same order
            if binary.peak_macs and binary.bytes_per_cycle:
                roofs[binary.info.get("hardware")] = (binary.peak_macs, binary.bytes_per_cycle)
        fixed = []
        lowest = min((point[0] for _, _, point in named), default=1.0)
        for hardware, (peak, bandwidth) in sorted(roofs.items()):  # from below the points on
            x = np.logspace(min(np.log10(lowest / 4), np.log10(peak / bandwidth) - 1), 4, 200)
            ax.plot(x, np.minimum(peak, x * bandwidth), color="#333", linewidth=1)
            label = f"{hardware} peak {peak} MAC/cycle"  # above the roof: no point is there
            fixed.append(ax.text(1e4, peak * 1.15, label, ha="right", va="bottom"))
        ax.set_xscale("log")
        ax.set_yscale("log")
        if roofs:
            ax.set_ylim(top=4 * max(peak for peak, _ in roofs.values()))
        ax.set_xlabel("arithmetic intensity (MACs per DRAM byte)")
        ax.set_ylabel("attained MACs per cycle")
        ax.set_title("Roofline: NPU layers against the hardware's compute and DMA limits")
        columns = 1 if len(binaries) < 4 else 2
        fig.legend(loc="outside lower center", fontsize=7, ncols=columns, frameon=False)
        fig.draw_without_rendering()  # the layout settles: label boxes are final from here
        fig.set_layout_engine("none")
        _label_points(ax, sorted(named, key=lambda item: (-item[0], item[1])), fixed)
        return svg_text(fig, "roofline")


OFFSETS = ((4, 2, "left"), (4, -8, "left"), (-4, 2, "right"), (-4, -8, "right"))
MAX_NAMED = 40  # points offered a name, the most MACs first


def _label_points(ax, named: list[tuple[int, str, tuple[float, float]]], fixed: list) -> int:
    """Name points in this order, each at the first of OFFSETS where its text overlaps no
    name placed before nor the `fixed` texts and stays inside the axes; a name that fits
    nowhere is left out. Each name is measured once (the other offsets shift its box).
    Returns how many were named."""
    inside = ax.get_window_extent()
    taken = [text.get_window_extent() for text in fixed]
    scale = ax.figure.dpi / 72  # points to pixels
    placed = 0
    for _, name, point in named[:MAX_NAMED]:
        dx, dy, align = OFFSETS[0]
        label = ax.annotate(clip(name, 16), point, xytext=(dx, dy), ha=align, fontsize=6,
                            textcoords="offset points", color="#444")  # fmt: skip
        first = label.get_window_extent()
        for dx, dy, align in OFFSETS:
            shift_x = (dx - OFFSETS[0][0]) * scale - (first.width if align == "right" else 0)
            box = first.translated(shift_x, (dy - OFFSETS[0][1]) * scale)
            within = box.x0 >= inside.x0 and box.x1 <= inside.x1 and box.y0 >= inside.y0
            if within and box.y1 <= inside.y1 and not any(box.overlaps(t) for t in taken):
                label.set_position((dx, dy))
                label.set_horizontalalignment(align)
                taken.append(box)
                placed += 1
                break
        else:
            label.remove()
    return placed
