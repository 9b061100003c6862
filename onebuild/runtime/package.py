"""Load, validate and run an nnpackage (a folder or a zip of one).

Everything is checked before anything runs: the MANIFEST's fields, every model file (loaded and
validated by its own reader), model paths staying inside the package, each model's config, and
the connection graph (every reference in range, every model input fed exactly once, edges
joining tensors of the same dtype, shape and quantization, no cycles). Then CPU models (circle,
read into the IR, or IR files) run in the reference interpreter and binaries through the target
of their model type (.tvn: the TRIX simulator), in dependency order; the app sees float
arrays, converted with the package I/O's quantization parameters unless `raw` (without `raw`, a
quantized input takes float data only: integer data could be codes or values).
"""

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import FormatError, ModelError, UserError
from ..graph_ir.interpreter import Interpreter
from ..graph_ir.ir import Model
from ..graph_ir.quant.params import dequantize, quantize
from ..graph_ir.serde import load_ir, read_circle
from ..graph_ir.tensor import QuantParams
from ..nnpackage import (
    MAX_CONFIG_BYTES,
    MAX_MANIFEST_BYTES,
    Manifest,
    Ref,
    parse_config,
    parse_manifest,
)
from ..npz import check_finite, refuse_codes, source_of
from ..targets import binary_target, installed, target_of_type
from ..targets.binary import run_binary
from .package_files import check_total, extract_zip, looks_like_zip, package_file, read_bounded
from .session_io import integer_input

IR_TYPES = ("circle", "obir")  # models the CPU runs in the reference interpreter; others: targets


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    dims: tuple[int, ...]
    quant: QuantParams | None

    @property
    def quantized(self) -> bool:
        return self.quant is not None and np.issubdtype(np.dtype(self.dtype), np.integer)

    def describe(self) -> str:
        q = f" scale={self.quant.scale[0]:.6g} zp={self.quant.zero_point[0]}" if self.quant else ""
        return f"{self.dtype}{list(self.dims)}{q}"


@dataclass
class PackageModel:
    path: str
    kind: str
    backend: str
    config: dict[str, str]
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    program: object  # a Graph (IR models) or a target's Binary

    def run(self, feeds: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict | None]:
        """Raw [N, *dims] arrays in, raw arrays out, and a binary's performance summary."""
        if self.kind not in IR_TYPES:
            return run_binary(self.program, feeds, raw=True)
        return Interpreter(self.program).run_batch(feeds), None


@dataclass
class Package:
    root: str
    manifest: Manifest
    models: list[PackageModel]
    config: dict[str, str]
    order: list[int]
    inputs: list[TensorSpec] = field(default_factory=list)
    outputs: list[TensorSpec] = field(default_factory=list)
    folder: object = None  # keeps a zip's extraction folder alive while the package is used


def load_package(path: str | os.PathLike) -> Package:
    """A fully validated package; a zip is checked and extracted to a temporary folder first."""
    path = Path(path)
    if looks_like_zip(path):
        folder = tempfile.TemporaryDirectory(prefix="onebuild-pkg-")
        package = _load_folder(extract_zip(path, Path(folder.name)), str(path))
        package.folder = folder
        return package
    if not path.is_dir():
        what = "no such file or folder" if not path.exists() else "neither a folder nor a zip"
        raise FormatError(f"{path}: not an nnpackage ({what})")
    if not os.path.lexists(path / "metadata" / "MANIFEST"):
        raise FormatError(f"{path}: not an nnpackage (no metadata/MANIFEST)")
    return _load_folder(path, str(path))


def _load_folder(root: Path, shown: str) -> Package:
    manifest_path, size = package_file(root, "metadata/MANIFEST", shown, "the manifest")
    data = read_bounded(manifest_path, MAX_MANIFEST_BYTES, f"{shown}: MANIFEST")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise FormatError(f"{shown}: MANIFEST is not UTF-8 text") from None
    manifest = parse_manifest(text, f"{shown}: MANIFEST")
    sizes = [size]
    config = {}
    for name in manifest.configs:
        config.update(_read_config(root, f"metadata/{name}", shown, sizes))
    files = []
    for index, relative in enumerate(manifest.models):
        file, size = package_file(root, relative, shown, f"models[{index}]")
        files.append(file)
        sizes.append(size)
    check_total(sizes, shown)
    models = [_load_model(root, shown, i, manifest, files[i]) for i in range(len(files))]
    package = Package(str(root), manifest, models, config, [])
    _check_connections(package, f"{shown}: MANIFEST")
    return package


def _read_config(root: Path, relative: str, shown: str, sizes: list[int]) -> dict[str, str]:
    file, size = package_file(root, relative, shown, "config file")
    sizes.append(size)
    data = read_bounded(file, MAX_CONFIG_BYTES, f"{shown}: {relative}")
    return parse_config(data.decode("utf-8", errors="replace"), f"{shown}: {relative}")


def _load_model(root: Path, shown: str, index: int, manifest: Manifest, file: Path) -> PackageModel:
    relative, kind = manifest.models[index], manifest.model_types[index]
    where = f"{shown}: models[{index}] '{relative}'"
    config = {}
    if manifest.model_configs[index]:
        sizes: list[int] = []
        config = _read_config(root, f"metadata/{manifest.model_configs[index]}", shown, sizes)
    target = None if kind in IR_TYPES else target_of_type(kind)
    if kind not in IR_TYPES and target is None:
        known = ", ".join([*IR_TYPES, *(t.model_type for t in installed())])
        raise FormatError(f"{where}: model type '{kind}' is not supported (supported: {known})")
    runs_on = "cpu" if target is None else target.backend
    backend = config.get("BACKENDS", runs_on)
    if backend != runs_on:
        raise FormatError(
            f"{where}: its config asks for backend '{backend}', but a {kind} model runs on "
            f"'{runs_on}'"
        )
    if binary_target(file) is not target:
        raise FormatError(f"{where}: the file is not a {kind} model")
    try:
        if target is not None:
            binary = target.load(file)
            specs = [[_binary_spec(t) for t in ts] for ts in (binary.inputs, binary.outputs)]
            return PackageModel(relative, kind, backend, config, *specs, binary)
        graph = load_cpu_model(file, kind).main
    except (FormatError, ModelError) as error:
        raise FormatError(f"{where}: {error}") from None
    specs = [[_ir_spec(v) for v in values] for values in (graph.inputs, graph.outputs)]
    return PackageModel(relative, kind, backend, config, *specs, graph)


def load_cpu_model(file: Path, kind: str) -> Model:
    """A CPU model of a package: an IR file, or a circle read into the IR."""
    if kind == "obir":
        return load_ir(file)
    with open(file, "rb") as handle:
        if handle.read(8)[4:8] != b"CIR0":
            raise FormatError("the file is not a circle model (no CIR0 identifier)")
    return read_circle(file, "circle")


def _binary_spec(t) -> TensorSpec:
    return TensorSpec(t.name, t.dtype, t.dims, t.quant)


def _ir_spec(value) -> TensorSpec:
    return TensorSpec(value.name, value.dtype.name, tuple(value.shape), value.quant)


def _check_connections(package: Package, shown: str) -> None:
    manifest, models = package.manifest, package.models

    def spec(ref: Ref, side: str, where: str) -> TensorSpec:
        if ref.model >= len(models):
            raise FormatError(
                f"{where}: {ref} names model {ref.model}, the package has {len(models)}"
            )
        if ref.subgraph != 0:
            raise FormatError(f"{where}: {ref} names subgraph {ref.subgraph}; models have one")
        specs = getattr(models[ref.model], side)
        if ref.io >= len(specs):
            raise FormatError(
                f"{where}: {ref} names {side[:-1]} {ref.io} of '{models[ref.model].path}', "
                f"which has {len(specs)}"
            )
        return specs[ref.io]

    if not manifest.pkg_inputs and not manifest.connect and len(models) == 1:
        manifest.pkg_inputs = [Ref(0, 0, i) for i in range(len(models[0].inputs))]
        manifest.pkg_outputs = [Ref(0, 0, i) for i in range(len(models[0].outputs))]
    fed: dict[Ref, str] = {}
    for i, ref in enumerate(manifest.pkg_inputs):
        where = f"{shown}: pkg-inputs[{i}]"
        package.inputs.append(spec(ref, "inputs", where))
        if ref in fed:
            raise FormatError(f"{where}: input {ref} is already fed by {fed[ref]}")
        fed[ref] = f"pkg-inputs[{i}]"
    listed: dict[Ref, int] = {}
    for i, ref in enumerate(manifest.pkg_outputs):
        where = f"{shown}: pkg-outputs[{i}]"
        package.outputs.append(spec(ref, "outputs", where))
        if ref in listed:
            raise FormatError(f"{where}: output {ref} is already pkg-outputs[{listed[ref]}]")
        listed[ref] = i
    sides = (("pkg-inputs", package.inputs, manifest.pkg_inputs),
             ("pkg-outputs", package.outputs, manifest.pkg_outputs))  # fmt: skip
    for side, specs, refs in sides:
        first: dict[str, int] = {}
        for i, name in enumerate(s.name for s in specs):
            # a model may list one output tensor twice (ONNX outputs [y, y]): one npz key
            twice = (
                side == "pkg-outputs" and name in first and refs[first[name]].model == refs[i].model
            )
            if name in first and not twice:
                raise FormatError(
                    f"{shown}: {side}[{i}] is tensor '{name}', as is {side}[{first[name]}]; "
                    "package inputs and outputs are named by their tensors"
                )
            first[name] = i
    after: dict[int, set[int]] = {m: set() for m in range(len(models))}
    pairs = []
    for i, (source, targets) in enumerate(manifest.connect):
        where = f"{shown}: model-connect[{i}]"
        produced = spec(source, "outputs", f"{where}.from")
        for target in targets:
            consumed = spec(target, "inputs", f"{where}.to")
            if target in fed:
                raise FormatError(f"{where}: input {target} is already fed by {fed[target]}")
            fed[target] = f"model-connect[{i}]"
            if target.model == source.model:
                raise FormatError(f"{where}: model {source.model} feeds itself")
            after[target.model].add(source.model)
            pairs.append((where, source, produced, target, consumed))
    for m, model in enumerate(models):
        for i in range(len(model.inputs)):
            if Ref(m, 0, i) not in fed:
                raise FormatError(
                    f"{shown}: input {m}:0:{i} ('{model.inputs[i].name}') of '{model.path}' is "
                    "fed by neither pkg-inputs nor model-connect"
                )
    package.order = _topological(after, shown)
    for where, source, produced, target, consumed in pairs:
        if (produced.dtype, produced.dims, produced.quant) != (
            consumed.dtype,
            consumed.dims,
            consumed.quant,
        ):
            raise FormatError(
                f"{where}: {source} is {produced.describe()} but {target} expects "
                f"{consumed.describe()}"
            )


def describe_package(package: Package) -> dict:
    """What `onebuild inspect PKG` shows: each model's file, backend and I/O (in execution
    order), the package's inputs and outputs and the connections."""

    def tensors(specs: list[TensorSpec]) -> list[dict]:
        return [{"name": t.name, "type": t.describe()} for t in specs]

    return {
        "models": [
            {
                "path": package.models[m].path,
                "type": package.models[m].kind,
                "backend": package.models[m].backend,
                "inputs": tensors(package.models[m].inputs),
                "outputs": tensors(package.models[m].outputs),
            }
            for m in package.order
        ],
        "inputs": [t.name for t in package.inputs],
        "outputs": [t.name for t in package.outputs],
        "connections": [
            {"from": str(s), "to": [str(t) for t in ts]} for s, ts in package.manifest.connect
        ],
        "config": package.config,
    }


def _topological(after: dict[int, set[int]], shown: str) -> list[int]:
    order, done = [], set()
    while len(order) < len(after):
        ready = [m for m in sorted(after) if m not in done and after[m] <= done]
        if not ready:
            stuck = sorted(m for m in after if m not in done)
            raise FormatError(f"{shown}: model-connect has a cycle through models {stuck}")
        done.add(ready[0])
        order.append(ready[0])
    return order


def run_package(
    package: Package, feeds: dict[str, np.ndarray], raw: bool = False
) -> tuple[dict[str, np.ndarray], list[dict | None]]:
    """Package outputs (keyed by their tensor names) for [N, *dims] inputs, and each model's
    simulator summary (None for CPU models)."""
    given: dict[tuple[int, int], np.ndarray] = {}  # (model, input) -> array
    for ref, spec in zip(package.manifest.pkg_inputs, package.inputs):
        if spec.name not in feeds:
            names = ", ".join(sorted(feeds)) or "none"
            raise UserError(f"missing input '{spec.name}' (inputs given: {names})")
        array = np.asarray(feeds[spec.name])
        if array.ndim != len(spec.dims) + 1 or tuple(array.shape[1:]) != spec.dims:
            raise UserError(
                f"input '{spec.name}' has shape {list(array.shape)}, expected "
                f"[N, {', '.join(map(str, spec.dims))}]"
            )
        if spec.quantized and not raw:
            if array.dtype.kind != "f":  # integer data could be codes or values: never guessed
                refuse_codes(spec.name, array, source_of(feeds))
                raise UserError(f"input '{spec.name}' is {array.dtype}; expected float data")
            check_finite({spec.name: array}, source_of(feeds))
            array = quantize(array.astype(np.float64), spec.quant, spec.dtype)
        elif np.dtype(spec.dtype).kind in "iu":  # indices: as the Session takes them
            array = integer_input(spec.name, array, spec.dtype)
        elif array.dtype != np.dtype(spec.dtype):
            raise UserError(f"input '{spec.name}' is {array.dtype}; expected {spec.dtype}")
        given[(ref.model, ref.io)] = array
    link = {(t.model, t.io): (s.model, s.io) for s, ts in package.manifest.connect for t in ts}
    produced: dict[tuple[int, int], np.ndarray] = {}  # (model, output) -> array
    reports: list[dict | None] = [None] * len(package.models)
    for m in package.order:
        model = package.models[m]
        inputs = {
            spec.name: given[(m, i)] if (m, i) in given else produced[link[(m, i)]]
            for i, spec in enumerate(model.inputs)
        }
        outputs, reports[m] = model.run(inputs)
        for i, spec in enumerate(model.outputs):
            produced[(m, i)] = outputs[spec.name]
    results = {}
    for ref, spec in zip(package.manifest.pkg_outputs, package.outputs):
        array = produced[(ref.model, ref.io)]
        results[spec.name] = dequantize(array, spec.quant) if spec.quantized and not raw else array
    return results, reports
