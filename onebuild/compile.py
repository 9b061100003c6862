"""The compile API: in-memory functions with typed options (`compile_options`, re-exported
here) that carry their own defaults.

The build's steps (`onebuild/tasks/`) are file I/O and caching around these functions; the
on-device Session calls the same ones. Nothing here needs pydantic, doit or onnx.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .compile_options import (
    CalibrationOptions,
    CodegenOptions,
    MixedPrecisionOptions,
    PartitionOptions,
    QuantizeOptions,
    options_from,
)
from .option_values import check_quantize_data, check_stem

if TYPE_CHECKING:
    from .graph_ir.ir import Graph, Model
    from .graph_ir.quant.config import QuantConfig

__all__ = [
    "CalibrationOptions",
    "CodegenOptions",
    "MixedPrecisionOptions",
    "PartitionOptions",
    "Partitioned",
    "QuantizeOptions",
    "calibrate",
    "calibrate_shard",
    "compile_file",
    "compile_graph",
    "equalize",
    "is_partition_folder",
    "merge_calibration",
    "optimize",
    "options_from",
    "partition",
    "quantize",
    "verify",
]
log = logging.getLogger("onebuild")


DEFAULT_PRESET = "O1"


def verify(graph: Graph) -> None:
    """The IR invariants (graph_ir.verify), checked after every step that changes a graph."""
    from .graph_ir.verify import verify as check

    check(graph)


def optimize(model: Model, preset: str = DEFAULT_PRESET) -> Model:
    """Value-preserving graph optimizations, in place (and returned)."""
    from .graph_ir.passes import run_preset

    run_preset(model, preset)
    return model


def equalize(graph: Graph, options: QuantizeOptions) -> Graph:
    """Cross-layer equalization of a float graph in place when `options` ask for it (full
    mode): float outputs are unchanged, so calibration, quantization and the accuracy gate's
    reference all apply it to the same graph (`quant.equalize`)."""
    if options.mode == "full" and options.equalization:
        from .graph_ir.quant.equalize import equalize as rescale

        rescale(graph)
    return graph


def calibrate(
    graph: Graph,
    batches: Iterable,
    options: CalibrationOptions = CalibrationOptions(),
    progress: Callable[[int], None] | None = None,
):
    """Activation statistics of a float graph over sample batches (see `quant.calibrate`)."""
    from .graph_ir.quant.calibrate import calibrate as observe

    method, observer = options.method, options.observer_options()
    return observe(graph, _labeled(batches), method, observer, options.min_samples, progress)


def _labeled(batches: Iterable) -> Iterable:
    """`(label, batch)` pairs from batches (`{input name: [N, *shape] array}`, alone, in a
    list, or already labeled); anything else is a one-line UserError saying what is expected."""
    from .errors import UserError

    if isinstance(batches, Mapping):
        batches = [batches]
    for index, item in enumerate(batches):
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], Mapping):
            label, item = item
        else:
            label = f"batch {index}"
        if isinstance(item, Mapping):
            empty = [k for k, v in item.items() if getattr(v, "shape", (1,))[:1] == (0,)]
            if empty:
                raise UserError(
                    f"calibrate: {label}: input '{empty[0]}' holds 0 samples; give each input "
                    "[N, *shape] with N >= 1"
                )
            yield label, item
        else:
            raise UserError(
                f"calibrate: batch {index} is a {type(item).__name__}; batches are dicts "
                "{input name: [N, *shape] array} (or (label, dict) pairs)"
            )


def calibrate_shard(
    graph: Graph,
    batches: Iterable,
    options: CalibrationOptions,
    index: int,
    count: int,
    progress: Callable[[int], None] | None = None,
):
    """The recorder of every `count`-th sample chunk from chunk `index` (see `calibrate`)."""
    from .graph_ir.quant.calibrate import record

    method, observer = options.method, options.observer_options()
    select = lambda n: n % count == index  # noqa: E731
    return record(graph, _labeled(batches), method, observer, progress, select)


def merge_calibration(recorders: Sequence, options: CalibrationOptions):
    """The statistics of all shards, identical to one pass's (see `quant.calibrate`)."""
    from .graph_ir.quant.calibrate import merge_recorders

    return merge_recorders(list(recorders), options.min_samples)


def _kept_dtypes(model: Model, options: QuantizeOptions) -> None:
    """A pre-quantized model keeps its parameters: asked for uint8, its int8 activations move
    to uint8 exactly (`int8_to_uint8`) where every node allows; otherwise one warning when its
    activations are not in the dtype asked for (a target may not run them)."""
    from .graph_ir.quant.int8_to_uint8 import convertible, int8_to_uint8

    graph = model.main
    values = [*graph.inputs, *(v for n in graph.nodes for v in n.outputs)]
    kept = sorted({v.dtype.name for v in values if v.quant is not None and v.dtype.kind in "iu"})
    if options.mode != "full" or not kept or kept == [options.dtype]:
        return
    stops = convertible(graph) if kept == ["int8"] and options.dtype == "uint8" else "-"
    if stops is None:
        count = int8_to_uint8(graph)
        verify(graph)
        log.info(
            "quantize: '%s' came quantized with int8 activations: %d of them moved to uint8 "
            "(zero point + 128, the same scale: exact), its int8 inputs and outputs kept",
            graph.name,
            count,
        )
        return
    log.warning(
        "quantize: '%s' came quantized with %s activations and keeps them (a pre-quantized "
        'model is not requantized%s), so quantize.dtype = "%s" does not apply: a target that '
        "runs no %s layers (see the partition table) leaves them on the CPU; quantize the "
        'float model for "%s"',
        graph.name,
        " and ".join(kept),
        "" if stops == "-" else f"; its {stops} cannot move to uint8",
        options.dtype,
        " or ".join(d for d in kept if d != options.dtype),
        options.dtype,
    )


def quantize(
    model: Model,
    options: QuantizeOptions = QuantizeOptions(),
    stats=None,
    samples: Sequence[Mapping[str, Any]] = (),
    fit: Sequence[Mapping[str, Any]] | None = None,
) -> Model:
    """Quantize `model` IN PLACE and return it (the same object: its main graph is replaced;
    copy the model first to keep the float one). Full mode needs calibration `stats`
    (`calibrate`); weight-only does not. With `options.mixed_precision`, layers are promoted
    by measuring on `samples` (batches of evaluation inputs, required); the choice is recorded
    in the model's metadata "mixed_precision". `weight_rounding = "adaround"` and
    `bias_correction = "empirical"` learn on `fit` (batches; `samples` if None; required):
    give them other samples than an accuracy gate measures on."""
    from .graph_ir.quant.from_qdq import graph_is_quantized
    from .graph_ir.quant.quantize_graph import nearest, quantize_graph
    from .graph_ir.quant.weight_only import weight_only_quantize

    if graph_is_quantized(model.main):  # a pre-quantized import keeps its own parameters
        log.info("quantize: '%s' is already quantized; its parameters are kept", model.main.name)
        _kept_dtypes(model, options)
        return model
    settings = options.quant_config()
    if options.mode == "weight_only":
        weight_only_quantize(model.main, settings)
        verify(model.main)
        return model
    from .graph_ir.quant.pixel_shuffle import split_pixel_shuffles

    fit = samples if fit is None else fit
    check_quantize_data(options, stats, samples, fit)
    ranges, means = stats.ranges_for(options.dtype), stats.channel_means()
    channel_ranges = stats.channel_ranges
    float_graph = equalize(model.main, options)
    windows = split_pixel_shuffles(float_graph)  # in integers and on the NPU, not float islands
    ranges.update({conv: ranges[out] for conv, out in windows.items() if out in ranges})

    rounder = nearest
    if options.weight_rounding == "adaround":
        from .graph_ir.quant.adaround import LearnedRounding, input_moments

        rounder = LearnedRounding(input_moments(float_graph, fit))

    memo: dict = {}  # tables and live ranges, computed once across mixed precision's probes

    correct = None
    if options.bias_correction == "empirical":  # every build, the search's probes too
        from .graph_ir.quant.empirical_bias import CACHE_BYTES, BiasCorrector

        cache = 0 if options.mixed_precision is None else CACHE_BYTES  # for many candidates
        correct = BiasCorrector(float_graph, fit, cache)

    def build(config: QuantConfig) -> Graph:
        return quantize_graph(float_graph, ranges, config, means, rounder, channel_ranges, memo)

    if options.mixed_precision is None:
        model.graphs[0] = build(settings)
        if correct is not None:
            correct(model.graphs[0])
    else:
        from .gates import json_safe
        from .graph_ir.quant.mixed_precision import MixedPrecisionTarget, search

        mixed = options.mixed_precision
        target = MixedPrecisionTarget(
            mixed.target_sqnr_db,
            mixed.dtype,
            mixed.max_high_precision_mac_fraction,
            mixed.trim_probes,
            mixed.promote_outputs,
        )
        result = search(float_graph, build, settings, samples, target, correct)
        model.graphs[0] = result.graph
        model.metadata["mixed_precision"] = json.dumps(json_safe(result.record), sort_keys=True)
    verify(model.main)
    return model


@dataclass
class Partitioned:
    """A quantized graph split between an accelerator and the CPU: one graph per part (in
    execution order, with file names as ONE's partitioner writes them), the connection
    information that ties them together and the report (strategy, estimate, fallbacks)."""

    name: str
    files: list[str]
    backends: list[str]
    graphs: list[Graph]
    connection: dict
    report: dict

    def save(self, folder: str | Path) -> Path:
        """Write the parts, `<name>.conn.json` and `<name>.partition.json` to `folder`
        (replaced atomically, if it is missing, empty or a partition folder onebuild wrote:
        `is_partition_folder`); returns the connection file."""
        from .fileio import atomic_folder, atomic_write_bytes
        from .graph_ir.ir import Model
        from .graph_ir.serde import save_ir

        check_stem(self.name, "partition name")
        for file in self.files:
            check_stem(file, "partition file name")
        folder = Path(folder)
        with atomic_folder(folder, is_partition_folder, "a partition folder") as staging:
            for file, graph in zip(self.files, self.graphs):
                save_ir(Model([graph]), staging / file)
            for suffix, data in ((".conn.json", self.connection), (".partition.json", self.report)):
                text = json.dumps(data, indent=2, sort_keys=True) + "\n"
                atomic_write_bytes(staging / f"{self.name}{suffix}", text.encode())
        return folder / f"{self.name}.conn.json"


def is_partition_folder(folder: Path) -> bool:
    """Whether `folder` holds only what `Partitioned.save` writes: one `<name>.conn.json`, its
    `<name>.partition.json`, the IR files of the parts the connection lists, and beside a part
    the binary an installed target compiles from it (`<part>.<binary suffix>`, e.g. `.tvn`:
    the Session and scripts compile parts in place)."""
    from .graph_ir.serde import MAGIC
    from .targets import available, binary_suffix

    try:
        names = {p.name for p in folder.iterdir() if not p.is_dir()}
        if any(p.is_dir() for p in folder.iterdir()):
            return False
        connections = [n[: -len(".conn.json")] for n in names if n.endswith(".conn.json")]
        if len(connections) != 1:
            return False
        name = connections[0]
        listed = json.loads((folder / f"{name}.conn.json").read_bytes())["parts"]
        parts = {part["file"] for part in listed}
        for part in parts & names:
            with open(folder / part, "rb") as handle:
                if handle.read(len(MAGIC)) != MAGIC:
                    return False
    except (OSError, ValueError, KeyError, TypeError):
        return False
    if not all(isinstance(part, str) and Path(part).name == part for part in parts):
        return False
    own = {f"{name}.conn.json", f"{name}.partition.json"}
    suffixes = {binary_suffix(target) for target in available()}
    binaries = {f"{Path(part).stem}.{suffix}" for part in parts for suffix in suffixes}
    return own <= names and names <= own | parts | binaries


def partition(
    graph: Graph,
    name: str,
    options: PartitionOptions = PartitionOptions(),
    codegen: CodegenOptions = CodegenOptions(),
    float_graph: Graph | None = None,
    maps: Mapping[str, Any] | None = None,
) -> Partitioned:
    """Split a quantized `graph` by the codegen target's constraints (and `options`); `maps`
    are the settings of a `.part` file, overridden by the options' own maps. With
    `cpu_precision = "float"` the CPU parts are recomputed from `float_graph`."""
    from .graph_ir.partition.float_parts import float_part
    from .graph_ir.partition.regions import connection_info
    from .graph_ir.quant.model_io import with_quantized_io
    from .targets import load_target
    from .targets.placement import Options, mac_share, place

    check_stem(name, "partition name")
    maps = maps or {}
    target = load_target(codegen.target)
    settings = {"default": options.default, "comply": options.comply}
    settings.update({k: maps[k] for k in ("default", "comply") if k in maps})
    placement_options = Options(
        accelerator=target.backend,
        hw=codegen.preset,
        strategy=options.strategy,
        opcode={**maps.get("opcode", {}), **options.opcode},
        opname={**maps.get("opname", {}), **options.opname},
        **settings,
    )
    graph = with_quantized_io(graph)
    placement = place(graph, name, target, placement_options)
    parts = placement.partitioning.parts
    backends = [p.backend for p in parts]
    files = [f"{name}.{i + 1:05d}_{b}.obir" for i, b in enumerate(backends)]
    left_quantized = []
    if options.cpu_precision == "float":
        if float_graph is None:
            from .errors import UserError

            raise UserError(
                f'{name}: partition: cpu_precision="float" recomputes CPU parts from the float '
                'graph: pass float_graph=, or cpu_precision="quantized"'
            )
        for file, part in zip(files, parts):
            recomputed = float_part(part.graph, float_graph) if part.backend == "cpu" else None
            if recomputed is not None:
                part.graph = recomputed
            elif part.backend == "cpu":
                left_quantized.append(file)
    report = {
        "strategy": options.strategy,
        "cpu_precision": options.cpu_precision,
        "cpu_parts_left_quantized": left_quantized,
        "hardware": placement_options.hw,
        "estimate": placement.latency,
        "explanation": placement.explanation,
        "hint": placement.hint,
        "fallbacks": placement.fallbacks,
        "macs": mac_share(graph, placement.backend_of),
        "parts": [
            {"file": f, "backend": p.backend, "nodes": len(p.graph.nodes)}
            for f, p in zip(files, parts)
        ],
    }
    info = connection_info(placement.partitioning, graph, files)
    for part in parts:
        verify(part.graph)
    return Partitioned(name, files, backends, [p.graph for p in parts], info, report)


def compile_graph(graph: Graph, options: CodegenOptions = CodegenOptions(), meta=None) -> bytes:
    """A quantized graph (or an accelerator part) as the target's binary. Without a partition
    the float boundary moves into the binary's I/O parameters, as with ONE's runtime."""
    from .graph_ir.quant.model_io import with_quantized_io
    from .targets import load_target

    target = load_target(options.target)
    graph = with_quantized_io(graph)
    verify(graph)
    return target.encode(graph, options.preset, options.pref, dict(meta or {}))


def compile_file(
    source: str | Path, output: str | Path, options: CodegenOptions = CodegenOptions()
) -> None:
    """An IR (or circle) file compiled to a binary file (written atomically) whose metadata
    names the digest of the file it came from (refused if the file changed while it was
    loaded and digested); the codegen step and the Session both write these."""
    import hashlib
    import os

    from .errors import UserError
    from .fileio import ANY_SIZE, atomic_write_bytes, not_a_file, open_regular, stamp
    from .graph_ir.serde import load_model

    source, output = Path(source), Path(output)
    try:
        file = open_regular(source, ANY_SIZE)
    except FileNotFoundError:
        raise not_a_file(source) from None
    with file:  # digested through the handle held across the load: one file, unchanged
        before = stamp(os.fstat(file.fileno()))
        model = load_model(source)  # a one-line error for a foreign file
        digest = hashlib.file_digest(file, "sha256").hexdigest()
        if not before == stamp(os.fstat(file.fileno())) == stamp(os.stat(source)):
            raise UserError(f"{source}: changed while it was compiled; compile it again")
    meta = {"source_sha256": digest}
    atomic_write_bytes(output, compile_graph(model.main, options, meta))
