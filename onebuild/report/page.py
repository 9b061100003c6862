"""The report page: one self-contained HTML file (inline SVG and CSS, no script, no network)
written atomically to `<build dir>/report.html`."""

import json
import shlex
from html import escape
from pathlib import Path

from ..engine.dag import StepResult
from ..fileio import atomic_write_bytes
from ..gates import search_limit
from ..graph_ir.serde import load_ir
from ..plan import Plan
from ..progress import Progress
from .calibration import calibration_histograms
from .charts_npu import roofline_chart, timeline_chart
from .charts_quant import histogram_chart, sqnr_chart
from .collect import BuildData, collect
from .figure import pyplot
from .freshness import Freshness
from .graph_svg import graph_svg, part_colours
from .latency import latency_section

REPORT_FILE = "report.html"

STYLE = """
body { font-family: sans-serif; margin: 1.5em auto; max-width: 1200px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }
td, th { border: 1px solid #ddd; padding: 2px 8px; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
figure { margin: 0.5em 0; overflow-x: auto; }
.run { color: #1a6; } .restored { color: #26a; } .failed { color: #c22; font-weight: bold; }
.swatch { display: inline-block; width: 1em; height: 1em; vertical-align: middle;
          border: 1px solid #333; margin: 0 0.3em 0 1em; }
.note { color: #666; } .stale { color: #b45f06; font-weight: bold; }
"""


def write_report(
    plan: Plan, results: list[StepResult] | None = None, overrides: list[str] = ()
) -> Path:
    """Write the report of `plan`'s build (with the statuses of the build that just ran, if
    given; else for the settings `plan` was loaded with, its `overrides`) and return its path."""
    pyplot()  # a missing matplotlib is one line, before any work
    progress = Progress(f"report {plan.recipe.name}", unit="parts read or drawn")

    def tick() -> None:
        progress(progress.done + 1)

    data = collect(plan, results, tick)
    sections = []
    for section in (_pipeline, _graph, _quantization, _npu, _package):
        sections.append(section(data))
        tick()
    progress.finish()
    title = f"onebuild report: {plan.recipe.name}"
    page = (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>\n"
        f"<h1>{escape(title)}</h1>\n<p>recipe {escape(str(plan.recipe))}, build folder "
        f"{escape(str(plan.build_dir))}</p>\n"
        + _not_built(data, overrides)
        + "\n".join(s for s in sections if s)
        + "\n</body></html>\n"
    )
    path = plan.build_dir / REPORT_FILE
    atomic_write_bytes(path, page.encode())
    return path


def _not_built(data: BuildData, overrides: list[str]) -> str:
    """A warning when some steps' outputs on disk are not made with these settings."""
    stale = list(dict.fromkeys(f"[{s.step}]" for s in data.steps if not s.fresh.current))
    if not stale:
        return ""
    if data.by_build:
        fix = "this build did not make them (see its errors)"
    else:
        command = " ".join(
            ["onebuild build", shlex.quote(str(data.plan.recipe))]
            + [f"--set {shlex.quote(o)}" for o in overrides]
        )
        fix = f"run <code>{escape(command)}</code> first"
    return (
        f'<p class="stale">Not built with these settings: {", ".join(stale)}. What another '
        f"build left in their place is not shown; {fix}.</p>\n"
    )


def _left_out(data: BuildData, *steps: str) -> str:
    """A section's note naming its steps that are not built with these settings."""
    stale = list(dict.fromkeys(f"[{s.step}]" for s in data.stale(*steps)))
    if not stale:
        return ""
    return (
        f'<p class="stale">{", ".join(stale)}: not built with these settings, left out '
        "(see the pipeline table).</p>"
    )


def _table(header: list[str], rows: list[list], numeric: set[int] = frozenset()) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(
            f'<td class="num">{escape(str(c))}</td>' if i in numeric else f"<td>{c}</td>"
            for i, c in enumerate(row)
        ) + "</tr>"
        for row in rows
    )  # fmt: skip
    return f"<table><tr>{head}</tr>{body}</table>"


def _figure(name: str, svg: str, caption: str) -> str:
    return (
        f'<figure id="{name}">{svg}<figcaption class="note">{escape(caption)}</figcaption></figure>'
    )


def _pipeline(data: BuildData) -> str:
    rows = []
    for s in data.steps:
        status = f'<span class="{s.status.replace(" ", "-")}">{escape(s.status)}</span>'
        seconds = "" if s.seconds is None else f"{s.seconds:.3f}"
        outputs = "<br>".join(f"{escape(p)} ({_size(n)})" for p, n in s.outputs)
        row = [escape(s.step), escape(s.part), _verdict(s.fresh, data.by_build), status, seconds]
        rows.append([*row, s.cache_key, outputs])
    hits = sum(s.status == "restored" for s in data.steps)
    first = "this build" if data.by_build else "with these settings"
    header = ["step", "part", first, "last made by", "seconds", "cache key", "outputs"]
    meaning = (
        "<i>this build</i> is what the build that wrote this page did with each task"
        if data.by_build
        else "<i>with these settings</i> is what <code>onebuild status</code> finds for the "
        "recipe and its options: <code>up-to-date</code> tasks are shown below, others are "
        "not built with these settings and their outputs on disk are left out"
    )
    return (
        "<h2>Pipeline</h2>"
        f"<p>{len(data.steps)} tasks; {hits} last restored from the step cache. {meaning}; "
        "<i>last made by</i> is what each task's log records: <code>run</code> computed it, "
        "<code>restored</code> copied it from the step cache.</p>" + _table(header, rows, {4})
    )


WOULD = {
    "run": "a build would run it",
    "restored": "a build would restore it from the step cache",
    "pending": "a build decides once the steps before it have run",
}


def _verdict(fresh: Freshness, by_build: bool) -> str:
    """A task's cell in the first pipeline column."""
    css = fresh.verdict.replace(" ", "-")
    word = f'<span class="{escape(css)}">{escape(fresh.verdict)}</span>'
    if fresh.current:
        return word + (" (outputs of the failed run)" if fresh.verdict == "failed" else "")
    if by_build:
        return f"{word}: {escape(fresh.why)}" if fresh.why else word
    would = WOULD.get(fresh.verdict, fresh.verdict)
    return f'<span class="stale">not built</span>: {escape(would)} ({escape(fresh.why)})'


def _graph(data: BuildData) -> str:
    steps = [s for s in ("partition", "quantize", "optimize", "import") if s in data.plan.steps]
    left_out = _left_out(data, steps[0]) if steps else ""
    if not data.graphs:
        return f"<h2>Model graph</h2>{left_out}" if left_out else ""
    fallbacks = (data.partition or {}).get("fallbacks", [])
    reasons = {f["node"]: f["reasons"] for f in fallbacks}
    colours = part_colours([backend for _, backend, _ in data.graphs])
    legend = "".join(
        f'<span class="swatch" style="background:{c}"></span>{escape(label)}'
        for (label, _, _), c in zip(data.graphs, colours)
    )
    svg = graph_svg(data.graphs, reasons)
    text = "<h2>Model graph</h2>"
    if data.partition:
        text += (
            f"<p>Partitioned by the <code>{escape(data.partition.get('strategy', ''))}</code> "
            f"strategy for {escape(str(data.partition.get('hardware', '')))}: NPU parts in blues "
            "and greens, CPU parts in oranges and reds; dashed nodes fell back to the CPU, with "
            "the reason on the right (hover a node for its full name).</p>"
        )
    text += f"{left_out}<p>{legend}</p>" + _figure(
        "graph", svg, "nodes in execution layers, inputs at the top"
    )
    if fallbacks:
        rows = [
            [escape(f["node"]), escape(f["op"]), escape("; ".join(f["reasons"]))] for f in fallbacks
        ]
        text += "<h3>CPU fallbacks</h3>" + _table(["node", "op", "why not on the NPU"], rows)
    return text


def _quantization(data: BuildData) -> str:
    quantize = data.plan.steps.get("quantize")
    if not quantize:
        return ""
    text = (
        f"<h2>Quantization</h2><p>{escape(quantize['mode'])} {escape(quantize['dtype'])}, "
        f"{escape(quantize['granularity'])} granularity, calibration method "
        f"<code>{escape(quantize['method'])}</code>.</p>"
    ) + _left_out(
        data, "calibrate", "quantize", "measure", *([] if data.gate_derived else ["evaluate"])
    )
    model = None if data.quantized is None else load_ir(data.quantized)
    dtypes = {} if model is None else _output_types(model)
    if quantize.get("layers"):
        text += "<h3>Mixed precision</h3>" + _mixed_precision(quantize, dtypes)
    if model is not None:
        text += _automatic_precision(model.metadata, dtypes, data.accuracy)
    layers, caption = [], ""
    if data.accuracy:
        text += _gate(data)
        layers = data.accuracy["layers"]
        caption = (
            f"{data.accuracy.get('samples')} evaluation samples; bars coloured by the layer's "
            "output type; the gate's limits apply to the model's outputs (table above), not to "
            "layers"
        )
    elif model is not None and "sqnr_check" in model.metadata:
        check = json.loads(model.metadata["sqnr_check"])
        layers = check["layers"]
        caption = (
            f"{check['samples']} calibration samples, measured by the quantize step's check "
            "(no [quantize.accuracy] gate); bars coloured by the layer's output type"
        )
    if layers:
        text += _figure("sqnr", sqnr_chart(layers, dtypes), caption)
    elif model is not None and not quantize.get("accuracy"):
        text += (
            '<p class="note">No per-layer SQNR: the build compared no samples (add a '
            "[quantize.accuracy] table with evaluation data, or calibration data, to see which "
            "layers lose the most).</p>"
        )
    if data.calibration and data.float_model:
        method, samples, items = calibration_histograms(
            load_ir(data.float_model).main, data.calibration, quantize.get("calibration"),
            quantize["dtype"], {"layers": layers} if layers else None,
        )  # fmt: skip
        if items:
            which = "the worst layers' outputs" if layers else "the widest ranges"
            caption = f"{which}; {method} calibration; counts on {samples} calibration samples"
            text += _figure("histograms", histogram_chart(items), caption)
    return text


def _gate(data: BuildData) -> str:
    """The accuracy gate's checks, marked failed when one is; when [evaluate] is not built with
    these settings, its thresholds applied to the measurement [measure] made with them."""
    gate = data.accuracy.get("gate", {})
    checks = [
        [escape(c["check"]), _value(c["value"]), escape(str(c.get("min", c.get("max")))),
         "passed" if c["passed"] else '<span class="failed">failed</span>']
        for c in gate.get("checks", [])
    ]  # fmt: skip
    if not checks:
        return ""
    failed = not gate.get("passed", True)
    title = "Accuracy gate" + (': <span class="failed">failed</span>' if failed else "")
    note = ""
    if data.gate_derived and failed:
        note = (
            '<p class="stale">The build stopped at [evaluate]: these checks fail on the '
            "measurement below (made by [measure] with these settings); later steps did not "
            "run.</p>"
        )
    elif data.gate_derived:
        note = (
            '<p class="stale">[evaluate] is not built with these settings: its thresholds are '
            "applied here to the measurement made by [measure].</p>"
        )
    elif failed:
        note = '<p class="stale">The build stopped at [evaluate]; later steps did not run.</p>'
    return f"<h3>{title}</h3>{note}" + _table(["check", "value", "limit", ""], checks)


def _output_types(model) -> dict[str, str]:
    """Node name -> the type of its first output in the quantized model."""
    return {n.name: str(n.outputs[0].dtype) for n in model.main.nodes if n.outputs}


def _value(value: float | None) -> str:
    """A gate check's value; null is an SQNR with no noise at all (JSON has no infinity)."""
    return "no noise" if value is None else f"{value:.4g}"


def _mixed_precision(quantize: dict, dtypes: dict[str, str]) -> str:
    """The recipe's per-layer settings and the output type each named layer got."""
    rows = [
        [escape(", ".join(layer["names"])), escape(layer.get("dtype") or quantize["dtype"]),
         escape(layer.get("granularity") or quantize["granularity"]),
         escape(", ".join(f"{name}: {dtypes.get(name, 'not found')}" for name in layer["names"]))]
        for layer in quantize["layers"]
    ]  # fmt: skip
    header = ["layers", "dtype", "granularity", "output type in the quantized model"]
    return _table(header, rows)


def _automatic_precision(metadata: dict, dtypes: dict[str, str], accuracy: dict | None) -> str:
    """What [quantize.mixed_precision] chose (the quantized model's record of its search): the
    target, what it reached on which samples (and on those it did not see, from the gate's
    `accuracy` report), and each promoted layer with its type in the quantized model."""
    if "mixed_precision" not in metadata:
        return ""
    choice = json.loads(metadata["mixed_precision"])
    fraction = choice.get("high_precision_mac_fraction") or 0.0
    promoted = choice.get("promoted", [])
    met = choice.get("target_met")
    text = (
        f"<h3>Automatic mixed precision</h3><p>target {choice.get('target_sqnr_db')} dB at the "
        f"outputs: {'reached' if met else 'not reached'} ({escape(_measured(choice, accuracy))})"
        f"; {len(promoted)} layer(s) promoted to {escape(str(choice.get('dtype')))}, "
        f"{100 * fraction:.1f} % of the MACs.{'' if met else ' ' + escape(_limit(choice))}</p>"
    )
    rows = [[escape(name), escape(dtypes.get(name, "not found"))] for name in promoted]
    return text + _table(["promoted layer", "output type in the quantized model"], rows)


def _db(value: float | None) -> str:
    return "no noise" if value is None else f"{value:.1f} dB"


def _measured(choice: dict, accuracy: dict | None) -> str:
    """The SQNR the search reached, the data it measured on, and the unseen samples' SQNR."""
    reached = _db(choice.get("sqnr_db"))
    seen = choice.get("measured_on")
    if not seen:
        return f"{reached} on the samples it measured"
    text = f"{reached} on the first {seen['samples']} samples of the {seen['data']} data"
    if seen["data"] == "accuracy":
        text += ", which the gate measures again"
    unseen = ((accuracy or {}).get("mixed_precision") or {}).get("unseen")
    if unseen:
        text += f"; {_db(unseen['sqnr_db'])} on the {unseen['samples']} gate samples it did not see"
    return text


def _limit(choice: dict) -> str:
    return f"What limits it: {search_limit(choice)}." if "steps" in choice else ""


def _npu(data: BuildData) -> str:
    binaries = [b for b in data.binaries if "layers_table" in b.info]
    text = "<h2>NPU</h2>" + _left_out(data, "codegen")
    if not binaries:
        return text if data.stale("codegen") else ""
    rows = [
        [escape(b.name), _layer_count(b.info), b.info.get("cycles"), b.info.get("milliseconds"),
         b.info.get("macs"), b.info.get("mac_utilization"), b.info.get("dram_bytes"),
         b.info.get("weight_bytes")]
        for b in binaries
    ]  # fmt: skip
    header = ["binary", "layers", "cycles", "ms", "MACs", "MAC use", "DRAM bytes", "weights"]
    text += _table(header, rows, set(range(1, 8))) + latency_section(data, _table)
    for index, binary in enumerate(binaries):
        caption = "layer spans follow each other; compute and DMA busy times overlap"
        text += _figure(f"timeline{index}", timeline_chart(binary, index), caption)
    caption = (
        "one point per layer with MACs: its MACs over the longest of its span on the timeline "
        "and its compute and DMA busy cycles (in a cascade, layers overlap)"
    )
    text += _figure("roofline", roofline_chart(binaries), caption)
    return text


def _layer_count(info: dict) -> str:
    """A binary's layers: those with instructions (the timeline's rows), and the others."""
    untimed = info.get("layers_without_instructions", [])
    more = f" (+{len(untimed)} without instructions: {', '.join(untimed)})" if untimed else ""
    return f"{len(info['layers_table'])}{more}"  # escaped by _table (a numeric column)


def _package(data: BuildData) -> str:
    if not data.package:
        return f"<h2>Package</h2>{_left_out(data, 'pack')}" if data.stale("pack") else ""
    rows = [[escape(name), _size(size)] for name, size in data.package]
    total = sum(size for _, size in data.package)
    text = (
        f"<h2>Package</h2>{_left_out(data, 'pack')}<p>{escape(str(data.package_path))}: "
        f"{len(data.package)} files, {_size(total)}.</p>" + _table(["file", "size"], rows, {1})
    )
    if data.not_circle:
        rows = [[escape(name), escape(why)] for name, why in data.not_circle.items()]
        text += "<h3>Models not in circle</h3>" + _table(["file", "why onebuild's IR"], rows)
    return text


def _size(count: int) -> str:
    return f"{count} B" if count < 10240 else f"{count / 1024:.1f} KiB"
