"""Quantization pictures: per-layer SQNR (worst first) and calibration histograms with the
ranges quantization used."""

import numpy as np

from .figure import clip, figure, svg_text

MAX_BARS = 30


DTYPE_COLOURS = {"uint8": "#4e79a7", "int8": "#76b7b2", "int16": "#59a14f"}
OTHER_COLOUR = "#9c755f"


def sqnr_chart(layers: list[dict], dtypes: dict[str, str] | None = None) -> str:
    """Horizontal bars of each layer's SQNR in dB, the worst at the top (the evaluate step's
    `layers`, already worst first), coloured and labelled by the layer's output type in the
    quantized model (`dtypes`: node -> type). No limit line: the gate's limits are on the
    outputs, and a layer below an output's limit is no failure. A layer with no noise at all
    (SQNR null: left in float32 by mixed precision, or exact) has no bar but a note."""
    dtypes = dtypes or {}
    shown = layers[:MAX_BARS]
    values = [layer["sqnr_db"] for layer in shown]
    kinds = [dtypes.get(layer["node"], "?") for layer in shown]
    labels = [
        f"{clip(layer['node'], 30)} ({layer['op']}, {kind})" for layer, kind in zip(shown, kinds)
    ]
    # the axes keep at least half the width beside long labels (9 pt: about 0.075 in a character)
    width = min(12.0, max(7.5, 2.6 + 2 * 0.075 * max(map(len, labels), default=0)))
    with figure("sqnr", width, 0.9 + 0.24 * len(shown)) as fig:
        ax = fig.add_subplot()
        positions = np.arange(len(shown))[::-1]
        bars = [v if v is not None and np.isfinite(v) else 0.0 for v in values]
        colours = [DTYPE_COLOURS.get(kind, OTHER_COLOUR) for kind in kinds]
        ax.barh(positions, bars, color=colours)
        from matplotlib.patches import Patch

        handles = [  # one legend entry per type, in order of appearance
            Patch(color=DTYPE_COLOURS.get(kind, OTHER_COLOUR), label=kind)
            for kind in dict.fromkeys(kinds)
        ]
        fig.legend(handles=handles, loc="outside right upper", title="output type")
        for y, v, kind in zip(positions, values, kinds):
            exact = v is None or not np.isfinite(v)
            text = _exact_note(kind) if exact else f"{v:.1f}"
            ax.annotate(text, (0 if exact else max(v, 0), y), xytext=(3, 0),
                        textcoords="offset points", va="center", fontsize=8,
                        color="#555" if exact else "black")  # fmt: skip
        ax.set_yticks(positions, labels)
        ax.set_xlabel("SQNR of the layer's output, quantized vs float (dB; higher is better)")
        more = f" (worst {len(shown)} of {len(layers)})" if len(layers) > len(shown) else ""
        ax.set_title(f"Per-layer SQNR, worst first{more}")
        return svg_text(fig, "sqnr")


def is_float(dtype: str | None) -> bool:
    return dtype is not None and dtype.startswith("float")


def _exact_note(dtype: str | None) -> str:
    """What a null SQNR means for a layer of this output type."""
    return f"{dtype}: not quantized, no noise" if is_float(dtype) else "exact: no noise"


def histogram_chart(items: list[tuple[str, np.ndarray, np.ndarray, tuple[float, float]]]) -> str:
    """Small multiples: each value's activation histogram (log counts) with the range it was
    quantized with as two red lines; (name, bin edges, counts, (lo, hi)) per value."""
    from matplotlib.ticker import NullLocator

    columns = min(3, len(items))
    rows = -(-len(items) // columns)
    with figure("histograms", 3.0 * columns, 2.2 * rows) as fig:
        axes = np.atleast_1d(fig.subplots(rows, columns)).ravel()
        for ax, (name, edges, counts, (lo, hi)) in zip(axes, items):
            ax.stairs(counts, edges, fill=True, color="#4e79a7")
            ax.set_yscale("log")
            ax.yaxis.set_minor_locator(NullLocator())  # a third of the chart's drawing time
            for x in (lo, hi):
                ax.axvline(x, color="#e15759", linewidth=1.2)
            ax.set_title(clip(name, 34), fontsize=8)
            ax.tick_params(labelsize=7)
        for ax in axes[len(items) :]:
            ax.set_visible(False)
        fig.suptitle("Calibration: activation histograms and the chosen ranges (red)")
        return svg_text(fig, "histograms")
