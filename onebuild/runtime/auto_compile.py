"""The session's state machine: INITIAL (float) -> QUANTIZED -> COMPILED, the artifacts of
each state kept in the workspace (`state.json`), and auto-compilation, which walks the states
behind the accuracy gate.

`AutoCompilation` is a mixin of `Session` (`session.py`): it reads and sets the session's model
and state (`_model`, `_state`, `_float`, `_float_runner`, `_recorder`, `workspace`, `settings`,
`reason`, `gates`, `choice`) and calls the session's `_run`, `_quantize_file`, `_codegen_file`,
`_set_codegen`, `_need_float` and `_need_workspace`. A state's model is switched to only once
its artifact is written; an artifact that goes missing or changes sends the session back to
the last intact state.
"""

import logging
from pathlib import Path

import numpy as np

from ..errors import OneBuildError
from ..gates import json_safe
from ..graph_ir.serde import load_model
from ..progress import Progress
from .choice import choose_state
from .gate import gate_reason, gate_report, thin_pass
from .models import GraphModel, compiled_model
from .workspace import sha256

log = logging.getLogger("onebuild")


class AutoCompilation:
    """Auto-compilation and the session state it persists; see the module docstring."""

    def run_with_auto_compilation(
        self,
        inputs: dict[str, np.ndarray] | None = None,
        target: str | None = None,
        pref: str | None = None,
    ) -> dict[str, np.ndarray]:
        """Run; float runs are recorded until `minmax_records`, then the model is quantized,
        compiled and switched to, each step behind the accuracy gate. `target` and `pref`
        replace the settings' (None keeps them, a package's `ODC_*` keys or the defaults)."""
        self._need_float("auto-compilation")
        self._set_codegen(target, pref)  # a typo must not undo what was compiled
        changed = self._decided_with is not None and self._decided_with != self.settings.key
        if changed and not self._read_only:  # read-only: it runs what it has
            log.warning(
                "on-device compilation settings changed; deciding again from the recorded runs"
            )
            self._done, self.reason, self.gates, self.choice = False, None, {}, None
            self._commit("INITIAL")
        if self._done or self._read_only:
            return self._run(inputs, record=False)
        if self._needs_records():
            outputs = self._run(inputs, record=True)
            if not self._needs_records():
                self.compile_now()
            return outputs
        self.compile_now()
        return self._run(inputs, record=False)

    def _needs_records(self) -> bool:
        """Fewer recorded runs than `minmax_records`, or fewer gate records than they keep
        (one was dropped because it was corrupted, or deleted: a run refills its place)."""
        if self._recorder.samples < self.settings.minmax_records:
            return True
        count = min(self._recorder.samples, self.settings.gate_samples)
        return count - len(self.workspace.missing_records(count)) < self._gate_count()

    def _gate_count(self) -> int:
        """The records the gate needs: those the recorded runs keep (at most `gate_samples`),
        counting no more runs than `minmax_records`."""
        settings = self.settings
        return min(self._recorder.samples, settings.minmax_records, settings.gate_samples)

    def compile_now(self) -> None:
        """Quantize, gate, compile, gate and switch (the steps already done are skipped). A
        workspace that cannot be written (a full disk, say) decides nothing: the session stays
        on its current model and tries again `minmax_records` runs later or at the next
        launch."""
        self._need_float("compile_now()")
        self._need_workspace("compile_now()")
        try:
            self._decide()
        except OSError as error:
            self._unwritable(error, self.workspace.folder)

    def _decide(self) -> None:
        """compile_now's steps, once the gate's records are all there (else recording refills
        them first)."""
        count = min(self._recorder.samples, self.settings.gate_samples)
        records = self.workspace.read_records(count)  # drops corrupted ones
        blocked = len(self.workspace.blocked_records(count))  # not files: never refilled
        if len(records) < self._gate_count() - blocked:
            log.warning(
                "%s: %d of %d recorded inputs are missing; recording refills them first",
                self.workspace.records_folder,
                self._gate_count() - len(records),
                self._gate_count(),
            )
            return
        self._decided_with = self.settings.key
        self._reference = [(feeds, self._float_runner.run(feeds)) for feeds in records]
        progress = Progress("on-device compile", 2, "steps")  # quantize+gate, codegen+gate
        try:
            if self._state == "INITIAL":
                reason = self._try_quantize()
                if reason:
                    return self._stop("INITIAL", reason)
            progress(1)
            reason = self._try_codegen() if self._state == "QUANTIZED" else None
            progress(2)
        finally:
            progress.finish()
        if self.settings.backend == "auto":
            return self._choose(reason)
        self._stop(self._state, reason)

    def _try_quantize(self) -> str | None:
        """Quantize and gate; switch to QUANTIZED, or say why not."""
        try:
            output = self._quantize_file()
        except OneBuildError as error:
            return f"quantization failed, staying on the float model: {error}"
        if not self._gate("quantized", GraphModel(load_model(output).main)):
            return gate_reason(self.gates, "quantized")
        self._commit("QUANTIZED", quantized=output)
        return None

    def _try_codegen(self) -> str | None:
        """Compile and gate; switch to COMPILED, or say why not."""
        try:
            output = self._codegen_file()
            model = compiled_model(output)
        except OSError:  # the workspace's storage, not the model: decided again later
            raise
        except Exception as error:  # a compiler failure must not take the app down
            return f"codegen failed, staying on the quantized model: {error}"
        if not self._gate("compiled", model):
            return gate_reason(self.gates, "compiled")
        self._commit("COMPILED", compiled=output)
        return None

    def _gate(self, candidate: str, model) -> bool:
        """Compare `model` with the float model on the recorded inputs; keep the report."""
        self.gates[candidate] = gate_report(
            model, self._reference, list(self.outputs), dict(self.settings.gate), candidate
        )
        if (warning := thin_pass(self.gates, candidate)) is not None:
            log.warning("%s", warning)
        return self.gates[candidate]["passed"]

    def _choose(self, reason: str | None) -> None:
        """backend = auto: the best gated candidate for the requirement, by the cost models."""
        quantized = load_model(self._quantized_path()).main
        best, self.choice = choose_state(
            self._float.main, quantized, self.gates, self.settings.requirement
        )
        self._stop(best, reason)

    def _stop(self, state: str, reason: str | None) -> None:
        """Auto-compilation is over: run `state` from now on (and say why, if it fell short)."""
        self._done, self.reason = True, reason
        if reason:
            log.warning("on-device compilation: %s", reason)
        self._commit(state)

    # ---- state --------------------------------------------------------------------------------

    def _quantized_path(self) -> Path | None:
        if self._float is None:
            return getattr(self, "_quantized_file", None)
        return self._artifact("quantized")

    def _artifact(self, kind: str) -> Path | None:
        """An artifact's path (kept relative to the workspace when inside it)."""
        artifact = self._artifacts.get(kind)
        return self.workspace.folder / artifact["path"] if artifact else None

    def _commit(self, state: str, **written: Path) -> None:
        """Switch to `state` (its artifacts written before) and persist the session state."""
        if self.workspace is None:
            self._switch_fixed(state, written)
            return
        for kind, path in written.items():
            where = path.resolve()
            if self.workspace.folder.resolve() in where.parents:
                where = where.relative_to(self.workspace.folder.resolve())
            self._artifacts[kind] = {"path": str(where), "sha256": sha256(path)}
            if kind == "quantized":
                self._artifacts.pop("compiled", None)
        self._switch(state)
        self._write_state()

    def _write_state(self) -> None:
        """Persist the state; a workspace that cannot be written leaves it to this session
        (the next launch resumes from the state last written)."""
        try:
            self._save_state()
        except OSError as error:
            self._unwritable(error, self.workspace.state_file)

    def _save_state(self) -> None:
        self.workspace.write_state(
            {
                "source": self._source_digest,
                "state": self._state,
                "done": self._done,
                "reason": self.reason,
                "settings": self._decided_with,
                "artifacts": self._artifacts,
                "gates": json_safe(self.gates),
                "choice": self.choice,
                "qpath": str(self._qpath) if self._qpath else None,
                "cpath": str(self._cpath) if self._cpath else None,
            }
        )

    def _switch(self, state: str) -> None:
        """Load the model of `state`; an artifact that is missing or changed sends the session
        back to the last state whose files are intact (and auto-compilation rebuilds the rest)."""
        for kind, wanted in (("compiled", "COMPILED"), ("quantized", "QUANTIZED")):
            if state != wanted:
                continue
            artifact = self._artifacts.get(kind)
            path = self._artifact(kind)
            if artifact and sha256(path) == artifact["sha256"]:
                self._model = (
                    compiled_model(path)
                    if kind == "compiled"
                    else GraphModel(load_model(path).main)
                )
                self._state = state
                return
            log.warning(
                "%s: the %s model is missing or changed; rebuilding it", self.workspace.folder, kind
            )
            self._artifacts.pop(kind, None)
            self._done = False
            state = "QUANTIZED" if kind == "compiled" else "INITIAL"
        self._model, self._state = self._float_runner, "INITIAL"

    def _switch_fixed(self, state: str, written: dict[str, Path]) -> None:
        """A session on an already quantized model can still compile it (no workspace state)."""
        if "compiled" in written:
            self._model = compiled_model(written["compiled"])
        self._state = state
