"""Output SQNR of many candidate quantizations of one float graph on fixed samples, sharing work.

The mixed-precision search quantizes the same graph many times with a few layers changed and
measures each candidate's outputs against the float model. `Probes` computes the float outputs
once and keeps each candidate node's results under a content key: a digest of its op,
attributes, output types, constants and the keys of its inputs (a Merkle hash of the subgraph
that computes it). A node whose key was computed before (by an earlier candidate, on the same
samples) returns the stored arrays instead of running, so a candidate costs only the nodes
downstream of what changed. The stored arrays are the ones a full run computes, so every SQNR
is bit-identical to `evaluate.compare_graphs` on the same samples. Past CACHE_BYTES, the results
of the nodes latest in the graph go first: an early node's result serves every candidate that
changes nothing before it, and candidates run the graph in order, so a least-recently-used
store smaller than one candidate's results (about 600 MB on the OCR models' 16 samples) drops
each result just before the next candidate asks for it (on the OCR recognizer, 256 MB kept
that way recomputed 24 % more nodes than a store holding everything; 512 MB by position, 2 %).

A candidate that only has to reach a target (`give_up_below`) runs a few samples at a time
and stops as soon as one output's noise so far, against that output's signal over all the
samples (known from the float outputs), puts its SQNR below the target: noise only grows, so
the full run could not reach it either.

Pieces run on `THREADS` threads, one piece ahead of the one being measured (numpy, BLAS and the
compiled kernels release the GIL); they are measured in order, so every SQNR and every point
where a candidate gives up are those of one thread, bit for bit.
"""

import hashlib
import heapq
import itertools
import os
import threading
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..interpreter import Interpreter
from ..ir import Graph, Node
from ..metrics import OutputMetrics, sqnr_db
from ..ops import OPS
from .evaluate import CHUNK, Batch, Comparison
from .model_io import dequantize_outputs, quantize_inputs

CACHE_BYTES = 512 << 20  # stored node results (the latest in graph order dropped first)
PIECES = 6  # candidates run each part in about this many pieces (a give-up point each)
THREADS = min(2, os.cpu_count() or 1)  # pieces run at once


def _feed(digest, item) -> None:
    """Feed `item` (attribute values: numbers, strings, arrays, nested lists and dicts) to the
    hash, with its type, so equal keys mean equal kernel arguments."""
    if isinstance(item, np.ndarray):
        digest.update(f"a{item.dtype.str}{item.shape}".encode())
        digest.update(np.ascontiguousarray(item).tobytes())
    elif isinstance(item, dict):
        digest.update(f"d{len(item)}".encode())
        for key in sorted(item, key=str):
            _feed(digest, key)
            _feed(digest, item[key])
    elif isinstance(item, list | tuple):
        digest.update(f"l{len(item)}".encode())
        for element in item:
            _feed(digest, element)
    elif isinstance(item, float | np.floating):
        digest.update(f"f{float(item).hex()}".encode())
    else:
        digest.update(f"{type(item).__name__}:{item!r};".encode())


_UNSHARED = itertools.count()


def node_keys(graph: Graph) -> dict[str, bytes]:
    """Per node name, the content key of its results (see the module docstring)."""
    keys: dict[int, bytes] = {}
    for value in graph.inputs:
        digest = hashlib.blake2b(digest_size=16)
        _feed(digest, ["input", value.name, value.dtype.str, value.shape, repr(value.quant)])
        keys[id(value)] = digest.digest()
    by_node = {}
    for node in graph.nodes:
        digest = hashlib.blake2b(digest_size=16)
        if node.subgraphs:  # bodies are not hashed: a unique key, never reused
            digest.update(f"unshared {next(_UNSHARED)}".encode())
        _feed(digest, [node.op, node.attrs, [(v.dtype.str, v.shape) for v in node.outputs]])
        for value in node.inputs:
            if value is None:
                digest.update(b"none")
            elif value.is_const:
                _feed(digest, value.numpy())
            else:
                digest.update(keys[id(value)])
        key = digest.digest()
        for index, value in enumerate(node.outputs):
            keys[id(value)] = key + bytes([index % 256])
        by_node[node.name] = key
    return by_node


class Probes:
    """Compare candidate graphs with `float_graph` on `batches` (their outputs only)."""

    def __init__(self, float_graph: Graph, batches: Sequence[Batch], cache_bytes=CACHE_BYTES):
        self.float_graph, self.cache_bytes = float_graph, cache_bytes
        self.reference = Interpreter(float_graph)
        self.parts = [
            {v.name: batch[v.name][start : start + CHUNK] for v in float_graph.inputs}
            for batch in batches
            for start in range(0, len(next(iter(batch.values()))), CHUNK)
        ]
        self.wanted: dict[tuple[int, int], dict] = {}  # (part, chunk) -> float outputs
        self.signals: dict[int, dict[str, float]] = {}  # chunk -> signal power per output
        self.stored: dict[tuple, tuple] = {}
        self.latest: list[tuple[int, int, tuple]] = []  # heap of (-position, number, key)
        self.numbers = itertools.count()  # ties: the oldest result goes first
        self.bytes = 0
        self.computed = self.reused = 0  # node runs, for the record
        self._lock = threading.Lock()  # the stored results and the counts, across threads

    def _want(self, index: int, chunk: int) -> dict:
        if (index, chunk) not in self.wanted:
            self.wanted[index, chunk] = self.reference.run_batch(self.parts[index], chunk)
        return self.wanted[index, chunk]

    def _remember(self, key: tuple, position: int, results: tuple) -> None:
        """Store `results` of the node at `position` of its graph, dropping the results of
        later nodes (the oldest first) to make room; none when all stored come earlier."""
        results = tuple(np.asarray(r) for r in results)
        size = sum(r.nbytes for r in results)
        while self.bytes + size > self.cache_bytes:
            if not self.latest or -self.latest[0][0] < position:
                return
            _, _, dropped = heapq.heappop(self.latest)
            self.bytes -= sum(r.nbytes for r in self.stored.pop(dropped))
        for array in results:
            array.flags.writeable = False  # a kernel writing into a stored result fails loudly
        self.stored[key] = results
        self.bytes += size
        heapq.heappush(self.latest, (-position, next(self.numbers), key))

    def _kernel(self, node: Node, position: int, key: bytes, state: threading.local):
        kernel = OPS[node.op].kernel

        def run(attrs, *args):
            stored_key = (*state.piece, key)
            with self._lock:
                results = self.stored.get(stored_key)
                if results is not None:
                    self.reused += 1
            if results is None:
                results = kernel(attrs, *args)
                with self._lock:
                    self.computed += 1
                    if stored_key not in self.stored:  # (another thread's piece may have)
                        self._remember(stored_key, position, results)
            return results

        return run

    def _signal(self, chunk: int) -> dict[str, float]:
        """Each output's signal power over all the samples, summed as `OutputMetrics` does."""
        if chunk in self.signals:
            return self.signals[chunk]
        metrics = {v.name: OutputMetrics() for v in self.float_graph.outputs}
        for index in range(len(self.parts)):
            want = self._want(index, chunk)
            for name, m in metrics.items():
                for sample in want[name]:
                    reference = np.asarray(sample, np.float64).reshape(-1)
                    m.signal += float(reference @ reference)
        self.signals[chunk] = {name: m.signal for name, m in metrics.items()}
        return self.signals[chunk]

    def samples(self) -> Batch:
        """Every sample of the parts, in order, as one batch."""
        return {name: np.concatenate([p[name] for p in self.parts]) for name in self.parts[0]}

    def compare(
        self, candidate: Graph, give_up_below: float | None = None, computed: Batch | None = None
    ) -> Comparison:
        """The output metrics of `candidate` against the float graph, as `compare_graphs`
        computes them (its per-layer table left empty). With `give_up_below` (dB), the run
        stops once some output cannot reach it; the result is then marked incomplete and each
        sqnr_db is an upper bound (the output's whole signal over its noise so far). `computed`:
        the candidate's outputs on `samples()`, computed elsewhere (empirical bias
        correction's pass), read instead of running it."""
        keys = node_keys(candidate)
        state = threading.local()  # per thread: state.piece = (part, step, first sample)
        kernels = {
            n.name: self._kernel(n, position, keys[n.name], state)
            for position, n in enumerate(candidate.nodes)
        }
        test_run = Interpreter(candidate, kernels=kernels)
        chunk = CHUNK if self.reference.batchable and test_run.batchable else 1
        offset_of = np.cumsum([0] + [len(next(iter(p.values()))) for p in self.parts])
        outputs = {v.name: OutputMetrics() for v in self.float_graph.outputs}
        first = self.float_graph.outputs[0].name
        signal = self._signal(chunk) if give_up_below is not None else {}
        result = Comparison()
        pieces = []
        for index, part in enumerate(self.parts):
            self._want(index, chunk)  # the float outputs, before threads share them
            count = len(next(iter(part.values())))
            step = max(1, -(-min(chunk, count) // PIECES))
            pieces += [(index, step, start) for start in range(0, count, step)]

        def run(piece: tuple[int, int, int]) -> dict:
            index, step, start = state.piece = piece
            if computed is not None:
                rows = slice(offset_of[index] + start, offset_of[index] + start + step)
                return dequantize_outputs(candidate, {n: a[rows] for n, a in computed.items()})
            feeds = {name: array[start : start + step] for name, array in self.parts[index].items()}
            return dequantize_outputs(
                candidate, test_run.run_batch(quantize_inputs(candidate, feeds), step)
            )

        with ThreadPoolExecutor(THREADS) as pool:
            ahead = deque(pool.submit(run, piece) for piece in pieces[:THREADS])
            for number, (index, _, start) in enumerate(pieces):
                got = ahead.popleft().result()
                if number + THREADS < len(pieces):
                    ahead.append(pool.submit(run, pieces[number + THREADS]))
                want = self._want(index, chunk)
                for offset in range(len(got[first])):
                    for name, metrics in outputs.items():
                        metrics.update(want[name][start + offset], got[name][offset])
                    result.samples += 1
                if give_up_below is None:
                    continue
                bounds = {name: sqnr_db(signal[name], m.sq_sum) for name, m in outputs.items()}
                if min(bounds.values()) < give_up_below:
                    result.outputs = {n: {"sqnr_db": db} for n, db in bounds.items()}
                    result.complete = False
                    for pending in ahead:  # started pieces finish (their results are kept)
                        pending.cancel()
                    return result
        result.outputs = {name: m.summary() for name, m in outputs.items()}
        return result
