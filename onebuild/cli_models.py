"""The model commands of the CLI: run, verify, export, inspect, import, targets (printing, exit
codes); `onebuild.cli` parses the arguments and dispatches here."""

import json
import logging
from collections import Counter
from pathlib import Path

from .cli_device import run_on_device
from .errors import UserError

log = logging.getLogger("onebuild")


def _load(args):
    from .graph_ir.serde import load_model  # model commands load numpy/onnx on demand

    shapes = dict(args.input_shape or [])
    return load_model(args.model, shapes or None)


def _check_output(output: str, suffixes: tuple[str, ...], *sources: str) -> None:
    """Refuse an -o that names a folder, a suffix the written format does not have, one of the
    command's own inputs, a file onebuild did not write or a folder that does not exist: a slip
    must not overwrite a model or its data (`runtime.outputs`)."""
    from .runtime.outputs import writable

    path = Path(output)
    if path.is_dir():
        raise UserError(f"{output}: is a folder; -o takes a file path ending in {suffixes[0]}")
    if path.suffix.lower() not in suffixes:
        raise UserError(
            f"{output}: -o writes {' or '.join(suffixes)} files; give a path ending in "
            f"{suffixes[0]}"
        )
    writable(path, [path.suffix.lower()[1:]], "-o", sources)


def _binary(args):
    """The compiled binary a model argument is (recognized by content by the installed
    targets: a .tvn, say), else None."""
    from .targets import binary_target

    target = binary_target(args.model) if Path(args.model).is_file() else None
    return target.load(args.model) if target is not None else None


def _is_package(path: str) -> bool:
    from .runtime.package_files import is_package  # a folder, or a zip (a truncated one too)

    return is_package(path)


def _package_summary(package, reports) -> list[str]:
    """One line per model: backend and the simulator's cycles, or the CPU estimate."""
    from .runtime.models import package_latency
    from .targets.host_cpu import HostCpu

    lines, cpu = [], HostCpu()
    for model, report in zip(package.models, reports):
        if report is not None:
            use = report.get("mac_utilization")
            lines.append(
                f"  {model.path} [{model.backend}]: {report['cycles']} cycles "
                f"({report['milliseconds']} ms)"
                + ("" if use is None else f", MAC utilization {use:.1%}")
            )
        else:
            us = cpu.graph_us(model.program)
            lines.append(
                f"  {model.path} [{model.backend}]: ~{us / 1000:.3f} ms estimated ({cpu.name})"
            )
    if any(report is not None for report in reports):
        total = package_latency(package, reports, cpu)
        lines.append(
            f"  end to end: ~{total['microseconds'] / 1000:.3f} ms (NPU parts simulated, "
            f"{total['npu_parts']} invocation(s) of {total['invoke_us']:g} us, CPU parts "
            f"estimated, {total['handoffs']} CPU<->NPU handoff(s): "
            f"{total['handoff_us']:.0f} us)"
        )
    return lines


def cmd_run(args) -> int:
    from .npz import read_npz, write_npz

    _check_output(args.outputs, (".npz",), args.model, args.inputs)
    if args.quantize or args.codegen or args.auto_compile:
        return run_on_device(args)
    feeds = read_npz(args.inputs)
    if _is_package(args.model):
        from .npz import from_file
        from .runtime.package import load_package, run_package

        package = load_package(args.model)
        try:
            outputs, reports = run_package(package, feeds, args.raw)
        except UserError as error:
            raise from_file(str(args.inputs), error) from None
        write_npz(args.outputs, outputs)
        for name, array in outputs.items():
            print(f"{name}: {array.dtype}{list(array.shape)}")
        print(f"{len(package.models)} model(s), per inference:")
        print("\n".join(_package_summary(package, reports)))
        return 0
    binary = _binary(args)
    if binary is not None:
        from .targets.binary import run_binary

        outputs, summary = run_binary(binary, feeds, args.raw)
        footer = f"{summary['cycles']} cycles per inference ({summary['milliseconds']} ms)"
    else:
        outputs, footer = _run_model(_load(args).main, feeds, args), None
    write_npz(args.outputs, outputs)
    for name, array in outputs.items():
        print(f"{name}: {array.dtype}{list(array.shape)}")
    if footer:
        print(footer)
    return 0


def _run_model(graph, feeds: dict, args) -> dict:
    """The reference interpreter on a batch; float data converted for quantized model I/O."""
    import numpy as np

    from .graph_ir.interpreter import Interpreter
    from .graph_ir.quant.model_io import dequantize_outputs, is_quantized, quantize_inputs
    from .npz import refuse_codes

    if not args.raw:
        for value in filter(is_quantized, graph.inputs):
            if value.name in feeds:
                refuse_codes(value.name, feeds[value.name], args.inputs)
        feeds = quantize_inputs(graph, feeds)
    try:
        with np.errstate(all="ignore"):  # NaN/Inf in float data: said once below
            outputs = Interpreter(graph).run_batch(feeds)
    except UserError as error:
        raise UserError(f"{args.inputs}: {error}") from None
    bad = [k for k, v in outputs.items() if v.dtype.kind == "f" and not np.isfinite(v).all()]
    if bad:
        log.warning("%s: output(s) %s hold NaN or Inf", args.inputs, ", ".join(bad))
    return outputs if args.raw else dequantize_outputs(graph, outputs)


def cmd_verify(args) -> int:
    """Package vs float reference on the same inputs: per-output metrics and performance."""
    from .graph_ir.interpreter import Interpreter
    from .graph_ir.metrics import KINDS, OutputMetrics, output_kind
    from .graph_ir.serde import load_model
    from .npz import read_npz
    from .runtime.models import package_latency
    from .runtime.package import load_package, run_package
    from .targets.host_cpu import HostCpu

    package = load_package(args.package)
    reference = load_model(args.reference, dict(args.input_shape or []) or None).main
    feeds = read_npz(args.inputs)
    outputs, reports = run_package(package, feeds)
    try:
        expected = Interpreter(reference).run_batch(
            {v.name: feeds[v.name] for v in reference.inputs}
        )
    except KeyError as error:
        raise UserError(f"{args.inputs}: no array for reference input {error}") from None
    report, kinds = {}, {}
    for name, array in outputs.items():
        if name not in expected:
            raise UserError(f"{args.reference}: has no output '{name}' to compare with")
        metrics = OutputMetrics()
        for want, got in zip(expected[name], array):
            metrics.update(want, got)
        kinds[name] = output_kind(array.shape[1:])
        report[name] = {"kind": kinds[name], **metrics.chosen(kinds[name])}
    if args.json:
        print(
            json.dumps(
                {
                    "outputs": report,
                    "models": _model_reports(package, reports),
                    "end_to_end": package_latency(package, reports, HostCpu()),
                },
                indent=2,
                sort_keys=True,
            )
        )
        return 0
    for name, summary in report.items():
        shown = ", ".join(f"{k} {v:.4g}" for k, v in summary.items() if k != "kind")
        print(f"{name}: {shown}")
    for kind in dict.fromkeys(kinds.values()):
        which = ", ".join(f"'{n}'" for n, k in kinds.items() if k == kind)
        print(f"  ({which}: {KINDS[kind][1]})")
    print("\n".join(_package_summary(package, reports)))
    return 0


def _model_reports(package, reports) -> list[dict]:
    return [
        {
            "model": m.path,
            "backend": m.backend,
            **({k: v for k, v in r.items() if k != "layers"} if r else {}),
        }
        for m, r in zip(package.models, reports)
    ]


def cmd_export(args) -> int:
    _check_output(args.output, (".onnx", ".circle", ".tflite"), args.model)
    model = _load(args)
    suffix = Path(args.output).suffix.lower()
    if suffix in (".circle", ".tflite"):
        from .fileio import atomic_write_bytes
        from .graph_ir.serde import write_circle

        atomic_write_bytes(args.output, write_circle(model, suffix[1:]))
        print(f"wrote {args.output} ({suffix[1:]})")
        if suffix == ".tflite":
            _warn_tflite_uint8_channels(model, args.output)
        return 0
    from .graph_ir.serde.onnx_export import save_onnx

    save_onnx(model, args.output)
    print(f"wrote {args.output} (ONNX opset 21)")
    return 0


def _warn_tflite_uint8_channels(model, output: str) -> None:
    """TFLite (LiteRT) convolutions take per-channel weights only with int8 or int16 data: a
    uint8 model with per-channel weights (onebuild's default) is written, onert and circle
    take it, LiteRT refuses it when it allocates its tensors."""
    convs = [
        n.name
        for g in _graphs(model.main)
        for n in g.nodes
        if n.op in ("QConv", "QGemm")
        and str(n.inputs[0].dtype) == "uint8"
        and n.inputs[1].quant is not None
        and n.inputs[1].quant.axis is not None
    ]
    if convs:
        log.warning(
            "%s: %d uint8 layer(s) with per-channel weights ('%s', ...): LiteRT refuses them "
            "(its uint8 kernels take per-tensor weights); for LiteRT quantize with dtype = "
            '"int8", or granularity = "layer"; onert runs this file',
            output,
            len(convs),
            convs[0],
        )


def _graphs(graph) -> list:
    """A graph and, recursively, the subgraphs its nodes hold (If branches, Loop bodies)."""
    return [graph, *(g for node in graph.nodes for sub in node.subgraphs for g in _graphs(sub))]


def summarize(model) -> dict:
    """Inputs, outputs, op histogram and parameter count of the main graph; the histogram
    counts the nodes of its If/Loop subgraphs too (the constants they read are the main
    graph's, copied into them, so parameters are counted in the main graph only)."""
    import numpy as np

    from .graph_ir import dtypes

    graph = model.main
    every = _graphs(graph)
    nodes = [node for g in every for node in g.nodes]
    constants = list(graph.constants.values())

    def entry(value):
        return {
            "name": value.name,
            "dtype": dtypes.name_of(value.dtype),
            "shape": list(value.shape),
        }

    # Weights and biases, float or quantized; int64 constants are shape operands and indices.
    params = sum(v.size for v in constants if v.dtype != np.int64)
    return {
        "inputs": [entry(v) for v in graph.inputs],
        "outputs": [entry(v) for v in graph.outputs],
        "ops": dict(sorted(Counter(node.op for node in nodes).items())),
        "nodes": len(nodes),
        "parameters": int(params),
        "constant_bytes": int(sum(v.const.nbytes for v in constants)),
        "subgraphs": len(model.graphs) + len(every) - 1,  # the main graph counts, as in circle
    }


def cmd_inspect(args) -> int:
    if _is_package(args.model):
        from .runtime.package import describe_package, load_package

        info = describe_package(load_package(args.model))
        if args.json:
            print(json.dumps(info, indent=2, sort_keys=True))
            return 0
        for model in info["models"]:
            print(f"{model['path']} [{model['backend']}]")
            for kind in ("inputs", "outputs"):
                print(f"  {kind}: " + ", ".join(f"{t['name']} {t['type']}" for t in model[kind]))
        print("package inputs: " + ", ".join(info["inputs"]))
        print("package outputs: " + ", ".join(info["outputs"]))
        return 0
    binary = _binary(args)
    if binary is not None:
        info = binary.describe()
        if args.json:
            print(json.dumps(info, indent=2, sort_keys=True))
        else:
            print("\n".join(binary.report(info)))
        return 0
    info = summarize(_load(args))
    if args.json:
        print(json.dumps(info, indent=2, sort_keys=True))
        return 0
    for kind in ("inputs", "outputs"):
        print(f"{kind}:")
        for v in info[kind]:
            print(f"  {v['name']}: {v['dtype']}{v['shape']}")
    print(f"ops ({info['nodes']} nodes):")
    for op, count in sorted(info["ops"].items(), key=lambda item: (-item[1], item[0])):
        print(f"  {op:<20} {count}")
    print(
        f"parameters: {info['parameters']:,} "
        f"({info['constant_bytes'] / 2**20:.1f} MiB of constants)"
    )
    return 0


def cmd_import(args) -> int:
    from .graph_ir.passes import PRESETS, run_preset
    from .graph_ir.serde import save_ir

    if args.optimize not in PRESETS:
        raise UserError(f"unknown preset '{args.optimize}' (known: {', '.join(PRESETS)})")
    _check_output(args.output, (".obir",), args.model)
    model = _load(args)
    if args.optimize != "O0":
        for record in run_preset(model, args.optimize):
            if record.modified:
                log.info("pass %s changed graph '%s'", record.name, record.graph)
    digest = save_ir(model, args.output)
    print(f"{args.output}: {len(model.main.nodes)} nodes, sha256 {digest[:16]}")
    return 0


def cmd_targets(args) -> int:
    from .targets import available, load_target

    info = {name: load_target(name).describe() for name in available()}
    if args.json:
        print(json.dumps(info, indent=2, sort_keys=True))
        return 0
    for name, target in info.items():
        print(f"target {name}")
        for preset, hw in target.get("presets", {}).items():
            print(f"  preset {preset}: " + ", ".join(f"{k}={v}" for k, v in hw.items()))
        for op, names in target.get("ops", {}).items():
            print(f"  {op}: " + ", ".join(names))
        print("  an op runs on the target when:")
        for constraint, text in target.get("constraints", {}).items():
            print(f"    {constraint}: {text}")
    return 0
