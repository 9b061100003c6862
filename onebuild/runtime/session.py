"""The on-device session: nnfw's flow in Python, and auto-compilation behind an accuracy gate.

    session = Session("model.nnpkg", workspace="odc")   # ONNX, IR file, .tvn or nnpackage
    outputs = session.run({"input": x})                 # float32 in, float32 out

A float model can be recorded (`set_execute_config("DUMP_MINMAX")`), quantized (`quantize()`)
and compiled (`codegen()`) by hand, or by `run_with_auto_compilation` (in `auto_compile`, a
mixin of `Session` holding the state machine): float runs are recorded until `minmax_records`,
then the model is quantized, gated, compiled, gated and switched to (`state`: INITIAL ->
QUANTIZED -> COMPILED). The gate compares each new model with the float one on recorded inputs;
a model that fails it, or a codegen that fails, leaves the session on the previous model with
the reason in `reason`. Quantization and codegen go through the compile API the build's steps
call (`onebuild.compile`), so their files equal what `onebuild build` makes from the same data.
Everything lives in a workspace (see `workspace`) that survives restarts and kills; without one
(`workspace=False`, or a read-only model folder) the session only runs its model.
"""

import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import Literal

import numpy as np

from ..errors import ModelError, UserError
from ..graph_ir.ir import Model
from ..graph_ir.quant.calibrate import RangeRecorder, channel_axes
from ..graph_ir.quant.channel_activations import edge_values
from ..graph_ir.quant.model_io import is_quantized
from ..graph_ir.serde import save_ir
from ..graph_ir.serde.irfile import ir_digest, ir_file_digest
from ..npz import check_finite
from ..odc import QUANT_TYPES, OdcSettings
from ..progress import Progress
from ..targets import check_preset, check_target
from .auto_compile import AutoCompilation
from .device_compile import codegen_file, codegen_model, quantize_file
from .models import GraphModel
from .opening import open_model
from .outputs import quantized_kind, writable
from .session_io import app_types, checked_feeds, delivered, tensor_name
from .workspace import Workspace, creatable

log = logging.getLogger("onebuild")
EXECUTE_CONFIGS = ("DUMP_MINMAX",)


def default_workspace(path: str | os.PathLike) -> Path:
    """Where a session on `path` keeps its workspace unless told: `PATH.odc` beside it."""
    path = Path(path)
    return path.with_name(path.name + ".odc")


class Session(AutoCompilation):
    """One model, run by an app; see the module docstring."""

    def __init__(
        self,
        path: str | os.PathLike,
        workspace: str | os.PathLike | Literal[False] | None = None,
        *,
        input_shapes: dict[str, list[int]] | None = None,
    ):
        """`workspace`: a folder (None: `default_workspace(path)`), or False for none: the
        session then runs its model without recording or compiling, as nnfw's session does."""
        self.path = Path(path)
        self.settings = OdcSettings()
        self.reason: str | None = None  # why the session stays on its current model
        self.gates: dict[str, dict] = {}  # accuracy gate reports by candidate
        self.choice: dict | None = None  # backend = auto: the estimates and the pick
        self._execute: set[str] = set()
        self._given_inputs: dict[str, np.ndarray] = {}
        self._given_outputs: dict[str, np.ndarray] = {}
        self._qpath: Path | None = None
        self._cpath: Path | None = None
        self._float: Model | None = None  # the float model, when it can be compiled on the device
        self._recording: Progress | None = None  # recorded runs towards minmax_records
        self._read_only = False  # the workspace could not be written: nothing is recorded
        self._retry_in: int | None = None  # runs until writing is tried again
        self._load(input_shapes)
        self.workspace = None  # a quantized model's workspace holds only its partitioned code
        self._folder = None if workspace is False else Path(workspace or default_workspace(path))
        self._no_workspace = "workspace=False" if self._folder is None else None
        if self._float is None:
            return
        if workspace is None and not creatable(self._folder):  # the model's folder is read-only
            self._no_workspace = f"{self._folder.parent} is read-only"
            log.warning(
                "%s: cannot create the session workspace (%s); running the model without "
                "recording or compiling: give Session(workspace=DIR) a folder on writable "
                "storage to compile on the device, or workspace=False to run without it",
                self._folder,
                self._no_workspace,
            )
        if self._no_workspace:
            self._runs_only()
        else:
            self.workspace = Workspace(self._folder)
            self._open_workspace()

    # ---- loading ------------------------------------------------------------------------------

    def _load(self, input_shapes) -> None:
        opened = self._opened = open_model(self.path, input_shapes)
        self.settings = opened.settings or self.settings
        self._circle = opened.circle
        if opened.runner is not None:
            self._io(opened.inputs, opened.outputs)
            self._model, self._state = opened.runner, "COMPILED"
        else:
            self._adopt(opened.model, opened.source)

    def _adopt(self, model: Model, source: Path | None = None) -> None:
        """A float model compiles on the device; a quantized one can still be compiled."""
        graph = model.main
        self._io(graph.inputs, graph.outputs)
        values = [*graph.inputs, *(v for n in graph.nodes for v in n.inputs if v is not None)]
        if any(is_quantized(v) for v in values):
            self._model, self._state, self._quantized_file = GraphModel(graph), "QUANTIZED", source
        else:
            self._float, self._float_runner = model, GraphModel(graph)
            self._model, self._state = self._float_runner, "INITIAL"

    def _io(self, inputs, outputs) -> None:
        def dims(t) -> tuple[int, ...]:
            return tuple(t.shape if hasattr(t, "shape") else t.dims)

        self.inputs = {t.name: dims(t) for t in inputs}
        self.outputs = {t.name: dims(t) for t in outputs}
        self._types = app_types([*inputs, *outputs])

    def _open_workspace(self) -> None:
        """Resume what the workspace holds for this model, or start it afresh. Nothing is
        written for an unchanged model, so a workspace on read-only storage still runs the
        model it built; one that cannot be written runs its current model unrecorded."""
        ws = self.workspace
        digest = ir_digest(self._float)
        saved = ws.read_state()
        claim = saved is None or saved.get("source") != digest
        try:
            if ir_file_digest(ws.model) != digest:  # written only when it differs
                if ws.model.is_file():  # the workspace's own file, whatever it holds now
                    ws.model.unlink()
                save_ir(self._float, ws.model)
            if claim:
                if saved is not None:
                    log.warning(
                        "%s: the model changed; recorded data and builds start over", ws.folder
                    )
                ws.forget()
        except OSError as error:  # the workspace is not this model's: no retry until relaunch
            self._unwritable(error, ws.model, retry=False)
        saved = {} if claim else saved
        self._recorder = self._resume_recorder(fresh=claim)
        if not self._read_only:
            ws.keep_records(self._recorder.samples)
        self._source_digest = digest
        self._decided_with = saved.get("settings")  # OdcSettings.key of the last decision
        self._done = saved.get("done", False)
        self.reason, self.gates = saved.get("reason"), saved.get("gates", {})
        self.choice = saved.get("choice")
        self._artifacts = saved.get("artifacts", {})
        self._qpath = Path(saved["qpath"]) if saved.get("qpath") else None
        self._cpath = Path(saved["cpath"]) if saved.get("cpath") else None
        self._switch(saved.get("state", "INITIAL"))
        if claim and not self._read_only:  # the workspace names its model before the first
            self._write_state()  # record, so a restart resumes
        if not self._read_only and not os.access(ws.folder, os.W_OK):
            self._read_only = True  # nothing to write now; recording and compiling would
            if not self._done:
                log.warning(
                    "%s: read-only workspace; this session runs its current model (%s) and "
                    "records nothing",
                    ws.folder,
                    self._state,
                )

    def _runs_only(self) -> None:
        """No workspace: the float model runs, nothing is recorded or decided (as on a
        read-only workspace); recording and compiling by hand are refused (`_need_workspace`)."""
        self._recorder = RangeRecorder()
        self._read_only, self._decided_with, self._done = True, None, False
        self._artifacts, self._source_digest = {}, None

    def _need_workspace(self, what: str) -> None:
        if self._no_workspace:
            raise UserError(
                f"{what} needs a session workspace and this session has none "
                f"({self._no_workspace}): give Session(workspace=DIR) a folder on writable "
                "storage (on the command line, --workspace DIR)"
            )

    def _unwritable(self, error: OSError, path: Path, retry: bool = True) -> None:
        """The workspace cannot be written (read-only, full, failing): the session runs its
        current model and records nothing, until `minmax_records` runs later (`retry`) or
        the next launch, which try again."""
        self._read_only = True
        self._retry_in = self.settings.minmax_records if retry else None
        when = f"after {self._retry_in} runs and " if retry else ""
        log.warning(
            "%s: %s; this session runs its current model without recording (it tries again "
            "%sat the next launch)",
            error.filename or path,
            error.strerror or error,
            when,
        )

    def _resume_recorder(self, fresh: bool = False) -> RangeRecorder:
        """A recorder continuing from the workspace's statistics file (empty without one, or
        `fresh`: the file is another model's)."""
        axes, edges = channel_axes(self._float.main), edge_values(self._float.main)
        stats = None if fresh else self.workspace.read_minmax()
        if stats:
            return RangeRecorder.resume(stats, axes, edges)
        return RangeRecorder(channel_axes=axes, channel_ranges=edges)

    # ---- the app's view -----------------------------------------------------------------------

    @property
    def state(self) -> str:
        """INITIAL (float model), QUANTIZED or COMPILED: the model `run` uses now."""
        return self._state

    @property
    def minmax_records(self) -> int:
        """Float runs recorded so far."""
        return self._recorder.samples if self._float is not None else 0

    def close(self) -> None:
        """Release the workspace for another process (also done when the session is garbage
        collected or the process ends); the session is not to be used after."""
        if self.workspace is not None:
            self.workspace.close()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def prepare(self) -> None:  # nnfw parity: the model is ready to run once loaded
        pass

    def set_input(self, key: int | str, array: np.ndarray) -> None:
        self._given_inputs[tensor_name(key, self.inputs)] = np.asarray(array)

    def set_output(self, key: int | str, buffer: np.ndarray) -> None:
        name = tensor_name(key, self.outputs)
        if tuple(np.shape(buffer)) != self.outputs[name]:
            raise UserError(
                f"output buffer for '{name}' has shape {list(np.shape(buffer))}, expected "
                f"{list(self.outputs[name])}"
            )
        self._given_outputs[name] = buffer

    def set_execute_config(self, key: str, value: str = "1") -> None:
        """DUMP_MINMAX: record the activation ranges (and first inputs) of float runs."""
        if key not in EXECUTE_CONFIGS:
            raise UserError(f"unknown execute config '{key}' (known: {', '.join(EXECUTE_CONFIGS)})")
        self._need_float(f"{key} records float runs")
        self._need_workspace(f"{key} (recording float runs)")
        if value not in ("0", "false", ""):
            self._execute.add(key)
        else:
            self._execute.discard(key)

    def reset_execute_config(self) -> None:
        self._execute.clear()
        self._end_recording()

    def run(self, inputs: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """One inference on the current model: arrays of the model's shapes, float32 (integer
        inputs and outputs, indices say, in the model's own integer type)."""
        if self.settings.auto_compile and self._float is not None:
            return self.run_with_auto_compilation(inputs)
        record = "DUMP_MINMAX" in self._execute and self._state == "INITIAL"
        return self._run(inputs, record)

    def _run(self, inputs, record: bool) -> dict[str, np.ndarray]:
        feeds = self._feeds(inputs)
        record = record and not self._read_only
        if self._retry_in is not None:  # a failed write: the next run after N tries again
            self._retry_in -= 1
            self._read_only = self._retry_in > 0
            self._retry_in = self._retry_in or None
        if record and not all(np.isfinite(array).all() for array in feeds.values()):
            log.warning("an input holds NaN or infinity: this run is not recorded")
            record = False
        if not record:
            quantized = {name: feeds[name] for name in self._model.quantized_inputs}
            check_finite(quantized, "run", batched=False)
            return self._deliver(self._model.run(feeds))
        runner = self._float_runner  # recording also sees inside layers (LSTM cell states)
        plain, runner.interpreter = runner.interpreter, self._recorder.interpreter(runner.graph)
        try:
            outputs = runner.run(feeds)
        except BaseException:  # the ranges saw a partial run: back to what the file holds
            self._recorder = self._resume_recorder()
            raise
        finally:
            runner.interpreter = plain
        try:
            self._keep(feeds)
        except OSError as error:  # recording is optional: the app keeps its result
            self._unwritable(error, self.workspace.folder)
            self._recorder = self._resume_recorder()
            return self._deliver(outputs)
        self._count_recorded()
        return self._deliver(outputs)

    def _keep(self, feeds: dict[str, np.ndarray]) -> None:
        """Write a recorded run: its input (into the first free place among the gate's
        records), then the ranges that count it."""
        ws, first = self.workspace, min(self._recorder.samples, self.settings.gate_samples)
        free = ws.missing_records(first) or ([first] if first < self.settings.gate_samples else [])
        if free:
            ws.write_record(free[0], feeds)
        self._recorder.samples += 1
        ws.write_minmax(self._recorder.stats())

    def _count_recorded(self) -> None:
        """Progress of on-device calibration: recorded runs (out of minmax_records when
        auto-compilation records, open-ended by hand until recording stops)."""
        total = None if "DUMP_MINMAX" in self._execute else self.settings.minmax_records
        if self._recording is None:  # a resumed recording starts at the runs it has
            self._recording = Progress("on-device calibration", total, "runs")
        self._recording(self._recorder.samples)
        if total is not None and self._recorder.samples >= total:
            self._end_recording()

    def _end_recording(self) -> None:
        if self._recording is not None:
            self._recording.finish()
            self._recording = None

    def _feeds(self, inputs) -> dict[str, np.ndarray]:
        given = self._given_inputs if inputs is None else inputs
        float_graph = self._float.main if self._float else None
        return checked_feeds(self.inputs, self._types, given, float_graph)

    def _deliver(self, outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return delivered(self.outputs, self._types, outputs, self._given_outputs)

    # ---- on-device quantization and codegen ---------------------------------------------------

    def set_quantization_type(self, qtype: str) -> None:
        """U8_ASYM, I16_SYM (full), WO_I8_SYM or WO_I16_SYM (weight-only)."""
        self.settings = self._changed(quant_type=qtype)

    def set_activation_granularity(self, granularity: str) -> None:
        """`tensor` (default) or `channel`: a scale and zero point per channel on Conv ->
        [table] -> Conv edges (the TRIX NPU runs them; circle cannot hold them)."""
        self.settings = self._changed(activation_granularity=granularity)

    def set_quantized_model_path(self, path: str | os.PathLike) -> None:
        """Where `quantize()` writes: a new file in an existing folder, or one onebuild wrote."""
        kinds = [quantized_kind(path)]
        self._qpath = writable(path, kinds, "set_quantized_model_path", [self.path])

    def set_codegen_model_path(self, path: str | os.PathLike) -> None:
        """Where `codegen()` writes: a new file in an existing folder, or onebuild's binary."""
        self._cpath = writable(path, ["binary"], "set_codegen_model_path", [self.path])

    def set_odc_param_minmax_records_count(self, count: int) -> None:
        self.settings = self._changed(minmax_records=int(count))

    def set_accuracy_gate(self, **thresholds: float | None) -> None:
        """Replace the gate, e.g. `min_sqnr_db=25` or `min_top1_match=0.99, max_mpeir=0.05`."""
        try:
            self.settings = self.settings.with_gate(thresholds)
        except ValueError as error:
            raise UserError(f"set_accuracy_gate: {error}") from None

    def set_backend(self, backend: str, requirement: str = "performance") -> None:
        """`npu` (compile and switch) or `auto`: the fastest (`performance`) or smallest
        (`memory`) of float CPU, quantized CPU and NPU that passes the accuracy gate."""
        self.settings = self._changed(backend=backend, requirement=requirement)

    def set_hardware(self, hw: str) -> None:
        """A hardware preset of an installed target (`onebuild targets` lists them)."""
        check_preset(hw)
        self.settings = self._changed(hw=hw)

    def _set_codegen(self, target: str | None, pref: str | None) -> None:
        """Take the codegen target and preference that are given, checked first."""
        given = {"target": target, "pref": pref}
        settings = self._changed(**{key: value for key, value in given.items() if value})
        check_target(settings.target, settings.hw)
        self.settings = settings

    def _changed(self, **changes) -> OdcSettings:
        try:
            return replace(self.settings, **changes)
        except ValueError as error:
            raise UserError(str(error)) from None

    def quantize(self) -> Path:
        """Quantize the float model with the recorded ranges; the session switches to it."""
        output = self._quantize_file()
        self._decided_with = self.settings.key
        self._commit("QUANTIZED", quantized=output)
        return output

    def _quantize_file(self) -> Path:
        self._need_float("quantize()")
        self._need_workspace("quantize()")
        self._end_recording()
        default = self.workspace.quantized
        output = self._qpath or (default.with_suffix(".circle") if self._circle else default)
        samples = self._recorder.samples
        return quantize_file(self.workspace, self.settings, samples, output, self.path)

    def codegen(self, target: str | None = None, pref: str | None = None) -> Path:
        """Compile the quantized model for `target` with preference `pref` (None: as the
        settings say, `ODC_TARGET`/`ODC_CODEGEN_PREF` of a package); the session switches to
        the binary."""
        self._set_codegen(target, pref)
        try:
            output = self._codegen_file()
        except ModelError as error:  # recorded, as auto-compilation records why it stays
            self.reason = f"codegen failed, staying on the {self._state.lower()} model: {error}"
            if self._cpath is not None:
                raise ModelError(
                    f"{error}; {self._cpath} can hold only a whole-model binary: without a "
                    "codegen model path the session partitions the model (NPU parts as "
                    "binaries, the rest on the CPU)"
                ) from None
            raise
        self.reason = None
        self._decided_with = self.settings.key
        self._commit("COMPILED", compiled=output)
        return output

    def _codegen_file(self) -> Path:
        source = self._quantized_path()
        if self._state != "QUANTIZED" or (source is None and self._float is not None):
            raise UserError(f"codegen() compiles a quantized model; the session is {self._state}")
        if QUANT_TYPES[self.settings.quant_type]["mode"] == "weight_only" and self._float:
            raise UserError(
                f"a {self.settings.quant_type} model keeps float activations; NPU code needs "
                "full quantization (U8_ASYM or I16_SYM)"
            )
        if self._float is None:  # it came quantized: the binary beside it
            paths = (self.path, self._folder)
            return codegen_model(self._opened.model, source, self.settings, self._cpath, paths)
        return codegen_file(self.workspace, self.settings, source, self._cpath)

    def _need_float(self, what: str) -> None:
        if self._float is None:
            raise UserError(f"{what} needs a float model; {self.path} is {self._state.lower()}")
