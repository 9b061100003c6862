"""What each fraction of int16 MACs buys: output SQNR against the high-precision MAC budget of
the mixed-precision search, per real trained model (`real_models.py`). Prints JSON lines, one
entry per model and settings; `--svg` draws the curves (`--plot` redraws them from saved JSON).

Per model and settings (`SETTINGS`: onebuild's defaults, and the best 8-bit settings of
`docs/quantization.md`), the points of the curve are:
- 0 %: the model quantized to uint8 (no search);
- the search at `target_sqnr_db` with no budget: the smallest fraction it finds that meets the
  target (budgets at or above it are not searched: that answer already fits them);
- the search with `max_high_precision_mac_fraction` = each budget below that fraction: the
  target cannot be met within it, and the search returns the best worst-output SQNR of the
  sets it probed within the budget (`target_met` false);
- 100 %: everything int16 (no search).
Each point: the promoted MAC fraction, the worst output's SQNR on the calibration images (what
the search measures) and on the held-out images. The sensitivity runs of the search do not
depend on the budget (same float graph, base model and samples), so they are computed once per
model and settings and reused by its searches (`_SensitivityMemo`); the probes run each time.

    OPENBLAS_NUM_THREADS=1 python bench/mixed_precision_pareto.py [--models ocr_det,...]
        [--budgets 0.1,0.2,0.25,0.3,0.4,0.5] [--settings defaults,best] [--target 30]
        [--samples 16] [--svg docs/mixed_precision_pareto.svg] > pareto.json
    python bench/mixed_precision_pareto.py --plot pareto.json --svg docs/mixed_precision_pareto.svg
        [--table]
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

from mixed_precision import _calibrated, _worst_db
from real_models import MODELS, fixed_export, samples

from onebuild.compile import MixedPrecisionOptions, QuantizeOptions, optimize, quantize
from onebuild.graph_ir.quant import mixed_precision
from onebuild.graph_ir.serde import load_onnx
from onebuild.report.figure import figure, svg_text

# (calibration method, QuantizeOptions) per model: onebuild's defaults (the layout detector
# meets 30 dB only with per-channel activations: its int16 floor per tensor is 18.9 dB) and the
# best 8-bit settings that the mixed-precision table of docs/quantization.md starts from
SETTINGS = {
    "defaults": {
        "layout_cdla": ("minmax", {"activation_granularity": "channel"}),
        "ocr_cls": ("minmax", {}),
        "ocr_det": ("minmax", {}),
        "ocr_rec": ("minmax", {}),
    },
    "best": {
        "layout_cdla": (
            "minmax",
            {"activation_granularity": "channel", "bias_correction": "empirical"},
        ),
        "ocr_cls": ("mse", {"activation_granularity": "channel", "bias_correction": "empirical"}),
        "ocr_det": (
            "minmax",
            {"activation_granularity": "channel", "bias_correction": "empirical"},
        ),
        "ocr_rec": ("minmax", {"activation_granularity": "channel"}),
    },
}
BUDGETS = (0.1, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6)


class _SensitivityMemo:
    """`isolated_output_noise` computed once per (model, settings, layers): the searches of
    one model and settings measure the same layers of the same base model on the same
    samples, whatever their budget."""

    def __init__(self, compute):
        self.compute, self.key, self.results = compute, None, {}

    def __call__(self, float_graph, quantized, batch, names):
        key = (self.key, tuple(names))
        if key not in self.results:
            self.results[key] = self.compute(float_graph, quantized, batch, names)
        return self.results[key]


_memo = _SensitivityMemo(mixed_precision.isolated_output_noise)
mixed_precision.isolated_output_noise = _memo


def _point(float_graph, model, label, held_out, seconds, budget=None) -> dict:
    record = json.loads(model.metadata["mixed_precision"])
    return {
        "point": label,
        "budget": budget,
        "high_precision_mac_fraction": round(record["high_precision_mac_fraction"], 4),
        "sqnr_db_calibration": round(record["sqnr_db"], 2),
        "sqnr_db_held_out": _worst_db(float_graph, model.main, held_out),
        "target_met": record["target_met"],
        "probes": len(record["steps"]),
        "cpu_seconds": round(seconds, 1),
    }


def measure(spec, settings: str, budgets, target: float, count: int, work: Path) -> dict:
    method, options = SETTINGS[settings][spec.name]
    path = fixed_export(spec, work)
    calib, held = samples(spec, count)
    float_graph = optimize(load_onnx(path)).main
    x = float_graph.inputs[0].name
    calib_batch, held_batch = {x: calib}, {x: held}
    stats = _calibrated(path, calib_batch, options, method)
    _memo.key = (spec.name, settings)
    points = []
    for dtype, fraction in (("uint8", 0.0), ("int16", 1.0)):
        model = quantize(
            optimize(load_onnx(path)), QuantizeOptions(dtype=dtype, **options), stats, [calib_batch]
        )
        points.append(
            {
                "point": f"all {dtype}",
                "budget": None,
                "high_precision_mac_fraction": fraction,
                "sqnr_db_calibration": _worst_db(float_graph, model.main, calib_batch),
                "sqnr_db_held_out": _worst_db(float_graph, model.main, held_batch),
                "target_met": None,
                "probes": 0,
                "cpu_seconds": None,
            }
        )

    def searched(budget):
        cpu = time.process_time()
        mixed = MixedPrecisionOptions(target, max_high_precision_mac_fraction=budget)
        settings_ = QuantizeOptions(mixed_precision=mixed, **options)
        model = quantize(optimize(load_onnx(path)), settings_, stats, [calib_batch])
        return model, time.process_time() - cpu

    model, seconds = searched(None)
    unbudgeted = _point(float_graph, model, "no budget", held_batch, seconds)
    points.append(unbudgeted)
    for budget in budgets:
        if budget < unbudgeted["high_precision_mac_fraction"]:
            model, seconds = searched(budget)
            points.append(_point(float_graph, model, "budget", held_batch, seconds, budget))
    points.sort(key=lambda p: (p["high_precision_mac_fraction"], p["budget"] or 0))
    return {
        "model": spec.name,
        "settings": settings,
        "method": method,
        "options": options,
        "target_sqnr_db": target,
        "calibration_samples": len(calib),
        "held_out_samples": len(held),
        "points": points,
    }


COLOURS = {
    "layout_cdla": "#4e79a7",
    "ocr_cls": "#f28e2b",
    "ocr_det": "#59a14f",
    "ocr_rec": "#e15759",
}
NAMES = {
    "layout_cdla": "layout detector",
    "ocr_cls": "OCR classifier",
    "ocr_det": "OCR detector",
    "ocr_rec": "OCR recognizer",
}
TITLES = {"defaults": "defaults", "best": "best 8-bit settings"}


def plot(entries: list[dict], target: float) -> str:
    """SQNR against the promoted MAC fraction, one panel per settings, one line per model
    (solid: calibration images, what the search measures; dotted: held out), thin from the
    last searched point to all int16."""
    panels = [s for s in SETTINGS if any(e["settings"] == s for e in entries)]
    with figure("pareto", 4.2 * len(panels), 3.6) as fig:
        axes = fig.subplots(1, len(panels), sharey=True, squeeze=False)[0]
        for ax, settings in zip(axes, panels):
            for entry in [e for e in entries if e["settings"] == settings]:
                colour, name = COLOURS[entry["model"]], NAMES[entry["model"]]
                *searched, everything = entry["points"]  # nothing measured between: thin
                for key, style in (("sqnr_db_calibration", "-"), ("sqnr_db_held_out", ":")):
                    xs = [100 * p["high_precision_mac_fraction"] for p in searched]
                    ys = [p[key] for p in searched]
                    label = name if key == "sqnr_db_calibration" else None
                    marker = "o" if key == "sqnr_db_calibration" else ""
                    ax.plot(xs, ys, style, marker=marker, color=colour, markersize=3, label=label)
                    ax.plot([xs[-1], 100], [ys[-1], everything[key]], style, color=colour,
                            linewidth=0.5, marker=marker, markersize=3, markevery=[1])  # fmt: skip
            ax.axhline(target, color="#333", linewidth=0.8, linestyle="--")
            ax.axvline(25, color="#333", linewidth=0.8, linestyle="-.")
            ax.annotate(
                f"{target:g} dB",
                (100, target),
                xytext=(-2, 2),
                textcoords="offset points",
                ha="right",
                fontsize=7,
            )
            ax.annotate(
                "25 %",
                (25, 0),
                xycoords=("data", "axes fraction"),
                xytext=(2, 2),
                textcoords="offset points",
                fontsize=7,
            )
            ax.set_xlim(0, 100)
            ax.set_xlabel("MACs in int16 (%)")
            ax.set_title(TITLES[settings], fontsize=9)
            ax.grid(alpha=0.3, linewidth=0.5)
        axes[0].set_ylabel("worst output SQNR (dB)")
        axes[0].legend(
            fontsize=7,
            loc="lower right",
            title="solid: calibration, dotted: held out",
            title_fontsize=6,
        )
        return svg_text(fig, "pareto")


def table(entries: list[dict]) -> str:
    """The points as a Markdown table, a row per model and settings, a column per budget:
    "promoted MACs: SQNR calibration / held out" (bold: the target met)."""
    budgets = sorted({p["budget"] for e in entries for p in e["points"] if p["budget"]})
    columns = ["all uint8", *budgets, "no budget", "all int16"]
    heads = [c if isinstance(c, str) else f"{100 * c:g} %" for c in columns]
    rows = [f"| model | settings | {' | '.join(heads)} |", "|---|---" + "|---" * len(heads) + "|"]
    for entry in entries:
        cells = dict.fromkeys(heads, "")
        for p in entry["points"]:
            head = p["point"] if p["budget"] is None else f"{100 * p['budget']:g} %"
            text = f"{100 * p['high_precision_mac_fraction']:.1f} %: "
            text += f"{p['sqnr_db_calibration']:.1f} / {p['sqnr_db_held_out']:.1f}"
            cells[head] = f"**{text}**" if p["target_met"] else text
        name, settings = NAMES[entry["model"]], TITLES[entry["settings"]]
        rows.append(f"| {name} | {settings} | {' | '.join(cells.values())} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="", help="comma-separated names (default: all)")
    parser.add_argument("--settings", default="defaults,best", help="of SETTINGS")
    parser.add_argument("--budgets", default=",".join(map(str, BUDGETS)), help="MAC fractions")
    parser.add_argument("--target", type=float, default=30.0, help="target_sqnr_db")
    parser.add_argument("--samples", type=int, default=16, help="samples per set (at most)")
    parser.add_argument("--svg", default="", help="write the chart here")
    parser.add_argument("--plot", default="", help="redraw from this JSON output, measure nothing")
    parser.add_argument("--table", action="store_true", help="print the points as Markdown")
    args = parser.parse_args()
    if args.plot:
        entries = [json.loads(line) for line in Path(args.plot).read_text().splitlines() if line]
    else:
        wanted = {m for m in args.models.split(",") if m}
        budgets = [float(b) for b in args.budgets.split(",") if b]
        entries = []
        with tempfile.TemporaryDirectory() as folder:
            for spec in [m for m in MODELS if not wanted or m.name in wanted]:
                for settings in args.settings.split(","):
                    entry = measure(
                        spec, settings, budgets, args.target, args.samples, Path(folder)
                    )
                    print(json.dumps(entry), flush=True)
                    entries.append(entry)
    if args.svg:
        Path(args.svg).write_text(plot(entries, args.target))
    if args.table:
        print(table(entries))


if __name__ == "__main__":
    main()
