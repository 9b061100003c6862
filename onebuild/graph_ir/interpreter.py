"""The numpy reference interpreter: ground truth for every numeric check in onebuild.

Each node runs its registered kernel. Intermediate arrays are freed after their last use, so peak
memory is the live set, not the whole trace. An optional observer sees every computed value
(graph inputs included) as `observer(value, array)`; calibration builds on it.
"""

from collections.abc import Callable, Mapping

import numpy as np

from ..errors import ExecutionError, InputValueError, UserError
from .batching import batch_plan
from .ir import Graph, Node, Value
from .ops import OPS
from .ops.registry import Kernel

Observer = Callable[[Value, np.ndarray], None]


def check_feeds(graph: Graph, feeds: Mapping[str, np.ndarray], batched: bool) -> None:
    """Raise a one-line UserError unless `feeds` has every input with the right shape."""
    given = ", ".join(sorted(feeds)) or "none"
    for value in graph.inputs:
        if value.name not in feeds:
            raise UserError(
                f"missing input '{value.name}' ({value.dtype}{list(value.shape)}); "
                f"inputs given: {given}"
            )
        array = np.asarray(feeds[value.name])
        shape = array.shape[1:] if batched else array.shape
        if batched and array.ndim == 0:
            shape = None
        if shape != value.shape:
            want = f"[N, {', '.join(map(str, value.shape))}]" if batched else list(value.shape)
            raise UserError(f"input '{value.name}' has shape {list(array.shape)}, expected {want}")
        if not np.can_cast(array.dtype, value.dtype, "same_kind"):
            raise UserError(f"input '{value.name}' has dtype {array.dtype}, expected {value.dtype}")


def release_schedule(graph: Graph) -> list[list[int]]:
    """For each node, the ids of values whose last reader it is (never graph outputs)."""
    last_use: dict[int, int] = {}
    for position, node in enumerate(graph.nodes):
        for value in node.inputs:
            if value is not None and not value.is_const:
                last_use[id(value)] = position
    keep = {id(v) for v in graph.outputs}
    schedule: list[list[int]] = [[] for _ in graph.nodes]
    for value_id, position in last_use.items():
        if value_id not in keep:
            schedule[position].append(value_id)
    return schedule


class Interpreter:
    """Runs one graph; build once, call `run` or `run_batch` many times."""

    def __init__(
        self,
        graph: Graph,
        observer: Observer | None = None,
        kernels: Mapping[str, Kernel] | None = None,
    ):
        """`kernels`: node name -> a kernel run instead of the registered one (calibration's
        LSTM kernels that report their cell states)."""
        self.graph = graph
        self.observer = observer
        self._kernels = []
        for node in graph.nodes:
            opdef = OPS.get(node.op)
            if opdef is None:
                raise ExecutionError(f"node '{node.name}': no kernel for op '{node.op}'")
            self._kernels.append((kernels or {}).get(node.name, opdef.kernel))
        self._release = release_schedule(graph)
        self._batch_plan = batch_plan(graph)

    @property
    def batchable(self) -> bool:
        """Whether `run_batch` runs several samples per pass."""
        return self._batch_plan is not None

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One inference: feeds keyed by input name, outputs keyed by output name."""
        check_feeds(self.graph, feeds, batched=False)
        return self._execute(feeds, None)

    def run_batch(self, feeds: Mapping[str, np.ndarray], chunk: int = 32) -> dict[str, np.ndarray]:
        """Run each sample of `[N, *input_shape]` arrays; outputs are stacked the same way.

        Batch-separable graphs (see `batching`) run `chunk` samples per pass; the observer then
        sees each value for a whole chunk at once.
        """
        check_feeds(self.graph, feeds, batched=True)
        count = {np.asarray(feeds[v.name]).shape[0] for v in self.graph.inputs}
        if len(count) > 1:
            raise UserError(f"inputs have different sample counts {sorted(count)}")
        samples = count.pop() if count else 1
        if self._batch_plan is None:
            results = []
            for i in range(samples):
                sample = {v.name: feeds[v.name][i] for v in self.graph.inputs}
                results.append(self._execute(sample, None))
            return {v.name: np.stack([r[v.name] for r in results]) for v in self.graph.outputs}
        parts = []
        for start in range(0, samples, chunk):
            step = min(chunk, samples - start)
            part = {v.name: feeds[v.name][start : start + step, 0] for v in self.graph.inputs}
            parts.append(self._execute(part, step))
        return {
            v.name: np.concatenate([p[v.name] for p in parts])[:, None] for v in self.graph.outputs
        }

    def _execute(self, feeds: Mapping[str, np.ndarray], batch: int | None) -> dict:
        """Run once; with `batch`, leading dims are the batch instead of 1."""
        env: dict[int, np.ndarray] = {}
        for value in self.graph.inputs:
            array = np.asarray(feeds[value.name]).astype(value.dtype, copy=False)
            env[id(value)] = array
            if self.observer:
                self.observer(value, array)
        plan = self._batch_plan if batch else None
        for index, (node, kernel, release) in enumerate(
            zip(self.graph.nodes, self._kernels, self._release)
        ):
            args = [self._read(env, v) for v in node.inputs]
            attrs = plan[index](batch) if plan and plan[index] else node.attrs
            try:
                results = kernel(attrs, *args)
            except InputValueError as error:  # the run's data, not the model or onebuild
                where = f"while executing node '{node.name}' ({node.op})"
                raise InputValueError(f"{where}: {error}") from None
            except Exception as error:
                raise ExecutionError(
                    f"while executing node '{node.name}' ({node.op}): {error}"
                ) from error
            self._store(env, node, results, batch)
            for value_id in release:
                env.pop(value_id, None)
        return {v.name: self._read(env, v) for v in self.graph.outputs}

    @staticmethod
    def _read(env: dict[int, np.ndarray], value: Value | None) -> np.ndarray | None:
        if value is None:
            return None
        if value.is_const:
            return value.numpy()
        return env[id(value)]

    def _store(self, env: dict[int, np.ndarray], node: Node, results, batch: int | None) -> None:
        if len(results) != len(node.outputs):
            raise ExecutionError(
                f"while executing node '{node.name}' ({node.op}): kernel returned "
                f"{len(results)} outputs, node declares {len(node.outputs)}"
            )
        for value, array in zip(node.outputs, results):
            array = np.asarray(array)
            shape = value.shape if batch is None else (batch * value.shape[0], *value.shape[1:])
            if array.shape != shape or array.dtype != value.dtype:
                raise ExecutionError(
                    f"while executing node '{node.name}' ({node.op}): output '{value.name}' is "
                    f"{array.dtype}{list(array.shape)}, declared {value.dtype}{list(shape)}"
                )
            env[id(value)] = array
            if self.observer:
                self.observer(value, array)
