"""Would promoting activations alone lower the int16 MAC fraction that 30 dB needs? An estimate
by fake quantization (`fake_quant.py`), no new kernels. Prints JSON, one entry per model.

Two ways to choose which multiply-accumulates run in int16, each a set H of promoted units
(`mixed_precision.layer_units`: a layer and the data-movement ops after it; per-channel edges
whole; units under NEGLIGIBLE_MAC_FRACTION of the MACs always in H), cost = the MACs of H:
- "layer" (what onebuild builds): a node of H runs in int16, weights and output; a value is
  on the int16 grid only between two int16 nodes (a uint8 reader requantizes it to uint8, an
  int16 reader of a uint8 value sees the uint8 rounding);
- "value" (activation-only promotion allowed): every producer may write int16 (one outside H
  keeps uint8 inputs and int8 weights: its MACs stay 8-bit), and every reader in H or without
  MACs (elementwise, pooling, tables, data movement) reads it so; a reader with MACs outside H
  reads it requantized to uint8. Weights are int16 in H.
Each way runs the same search in fake quantization: every measured unit's output noise when it
alone is rounded (the float network downstream of it, on the first SENSITIVITY_SAMPLES
calibration samples: under "layer" its inputs, weights and outputs, as the search's twins;
under "value" its convolutions' inputs and weights), the greedy knapsack of
`mixed_precision.keep_order`/`kept_within` over the noise the target leaves above the all-int16
floor, and probes (fake-quantized runs on all calibration samples) up and down the noise bound
until the smallest fraction that meets the target is bracketed within BRACKET. The "layer"
estimate is checked against the integer model onebuild builds for the same set (and all uint8,
all int16): the fake quantization leaves out the integer kernels' own rounding.

    OPENBLAS_NUM_THREADS=1 python bench/activation_promotion.py [--models ocr_det,layout_cdla]
        [--target 30] [--samples 16] [--sensitivity-samples 4]
"""

import argparse
import json
import math
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from fake_quant import FakeQuant, Rounding, alone_rounding, grids, way_rounding
from mixed_precision import _calibrated, _worst_db
from real_models import MODELS, fixed_export, samples

from onebuild.compile import QuantizeOptions, equalize, optimize
from onebuild.graph_ir.macs import graph_macs, macs
from onebuild.graph_ir.metrics import sqnr_db
from onebuild.graph_ir.quant.config import LayerOverride
from onebuild.graph_ir.quant.mixed_precision import (
    NEGLIGIBLE_MAC_FRACTION,
    edge_units,
    keep_order,
    kept_within,
    layer_units,
)
from onebuild.graph_ir.quant.pixel_shuffle import split_pixel_shuffles
from onebuild.graph_ir.quant.quantize_graph import nearest, quantize_graph
from onebuild.graph_ir.quant.sensitivity import downstream
from onebuild.graph_ir.serde import load_onnx

# the settings of the mixed-precision table in docs/quantization.md ("Where it stands")
SETTINGS = {
    "layout_cdla": ("minmax", {"activation_granularity": "channel"}),
    "ocr_det": ("minmax", {}),
    "ocr_cls": ("minmax", {}),
    "ocr_rec": ("minmax", {}),
}
SENSITIVITY_SAMPLES = 4
SCALE_STEP = 1.5
BRACKET = 1.1
MAX_PROBES = 12
WAYS = ("layer", "value")


class Model:
    """A real model quantized as `compile.quantize` does under mixed precision (no folded
    edges), its units and MACs, and fake quantization on its grids."""

    def __init__(self, spec, count: int, work: Path):
        method, options = SETTINGS[spec.name]
        path = fixed_export(spec, work)
        calib, held = samples(spec, count)
        settings = QuantizeOptions(**options)
        self.float_graph = equalize(optimize(load_onnx(path)).main, settings)
        x = self.float_graph.inputs[0].name
        self.calib, self.held = {x: calib}, {x: held}
        stats = _calibrated(path, self.calib, options, method)
        windows = split_pixel_shuffles(self.float_graph)
        self.ranges = stats.ranges_for(settings.dtype)
        self.ranges.update({c: self.ranges[o] for c, o in windows.items() if o in self.ranges})
        self.means, self.channel_ranges = stats.channel_means(), stats.channel_ranges
        self.config = replace(settings.quant_config(), fold_scales=False)
        self.memo: dict = {}
        low, high = self.build(()), self.build(None)
        units = layer_units(self.float_graph, low)
        members = {layer: [layer] for layer in units}
        if self.config.activation_granularity == "channel":
            units, members = edge_units(self.float_graph, units)
        self.units, self.members = units, members
        self.nodes = {n.name: n for n in self.float_graph.nodes}
        self.total = max(graph_macs(self.float_graph), 1)
        self.fake = FakeQuant(self.float_graph, grids(self.float_graph, low, high))
        self.reference = {
            label: {k: v.astype(np.float64) for k, v in self.fake.run.run_batch(b, 8).items()}
            for label, b in (("calibration", self.calib), ("held_out", self.held))
        }

    def build(self, promoted):
        """The integer model with `promoted` (node names) in int16; None: everything."""
        config = self.config
        if promoted is None:
            config = replace(config, dtype="int16")
        elif promoted:
            config = replace(
                config, layers=(*config.layers, LayerOverride(tuple(promoted), "int16"))
            )
        return quantize_graph(
            self.float_graph,
            self.ranges,
            config,
            self.means,
            nearest,
            self.channel_ranges,
            self.memo,
        )

    def fraction(self, names) -> float:
        return sum(macs(self.nodes[n]) for n in names) / self.total

    def rounding(self, way: str, promoted: set[str]) -> Rounding:
        return way_rounding(self.float_graph, way, promoted)

    def alone(self, way: str, unit: list[str]) -> Rounding:
        return alone_rounding(self.float_graph, way, unit)

    def worst_db(self, rounding: Rounding, label: str = "calibration") -> float:
        batch = self.calib if label == "calibration" else self.held
        got = self.fake.outputs(batch, rounding)
        return min(
            sqnr_db(float(np.vdot(want, want)), float(np.square(want - got[o]).sum()))
            for o, want in self.reference[label].items()
        )


def isolated_noise(model: Model, way: str, measured: list[str]) -> tuple[dict, dict]:
    """(signal per output, {unit: noise per output}) on the first SENSITIVITY_SAMPLES
    calibration samples, each unit rounded alone; only the nodes it reaches run again."""
    fake, graph = model.fake, model.float_graph
    batch = {k: v[:SENSITIVITY_SAMPLES] for k, v in model.calib.items()}
    chunk = len(next(iter(batch.values())))
    fake.cache, fake.recording = ({}, True) if fake.run.batchable else (None, False)
    reference = {k: v.astype(np.float64) for k, v in fake.outputs(batch, Rounding(), chunk).items()}
    fake.recording = False
    signal = {o: float(np.vdot(a, a)) for o, a in reference.items()}
    position = {n.name: i for i, n in enumerate(graph.nodes)}
    noise = {}
    for layer in measured:
        unit = model.units[layer]
        starts = [position[n] for n in unit]
        fake.live = downstream(graph, *starts) | set(starts)
        got = fake.outputs(batch, model.alone(way, unit), chunk)
        noise[layer] = {o: float(np.square(a - got[o]).sum()) for o, a in reference.items()}
    fake.cache, fake.live = None, set()
    return signal, noise


def search(model: Model, way: str, target: float) -> dict:
    """The smallest promoted MAC fraction whose fake-quantized model meets `target` on the
    calibration samples, found as the mixed-precision search does (module docstring)."""
    start = time.process_time()
    everything = {n for unit in model.units.values() for n in unit}
    got = model.fake.outputs(model.calib, model.rounding(way, everything))
    floor = {  # noise over signal per output
        o: float(np.square(want - got[o]).sum()) / float(np.vdot(want, want))
        for o, want in model.reference["calibration"].items()
    }
    floor_db = -10 * math.log10(max(floor.values()))
    aim = 10 ** (-target / 10)
    allowed = {o: max(aim - r, 1e-30) for o, r in floor.items()}
    measured = [k for k, u in model.units.items() if model.fraction(u) >= NEGLIGIBLE_MAC_FRACTION]
    signal, noise = isolated_noise(model, way, measured)
    cost = dict.fromkeys(model.units, math.inf)
    for layer in measured:
        cost[layer] = max(
            noise[layer][o] / signal[o] / allowed[o] if signal[o] else 0 for o in allowed
        )
    work = {
        k: sum(macs(model.nodes[n]) + model.nodes[n].outputs[0].size for n in unit)
        for k, unit in model.units.items()
    }
    order = {k: i for i, k in enumerate(model.units)}
    ranked = keep_order(cost, work, order)

    def chosen_at(scale: float) -> set[str]:
        kept = kept_within(ranked, cost, scale)
        return {n for k, unit in model.units.items() if k not in kept for n in unit}

    probes, seen = [], {}
    held, failed, scale = None, None, 1.0
    for _ in range(MAX_PROBES):
        promoted = chosen_at(scale)
        key = frozenset(promoted)
        if key not in seen:  # each set probed once
            seen[key] = model.worst_db(model.rounding(way, promoted))
            probes.append(
                {"fraction": model.fraction(promoted), "sqnr_db": seen[key], "promoted": promoted}
            )
        db = seen[key]
        if db >= target:
            held = scale if held is None else max(held, scale)
        else:
            failed = scale if failed is None else min(failed, scale)
        if held is not None and failed is not None:
            if failed / held < BRACKET:
                break
            scale = (held * failed) ** 0.5
        else:
            scale = scale * SCALE_STEP if held is not None else scale / SCALE_STEP
    holding = [p for p in probes if p["sqnr_db"] >= target]
    best = min(holding, key=lambda p: p["fraction"]) if holding else None
    estimate = {
        "floor_db": round(floor_db, 2),
        "measured_units": len(measured),
        "additive_estimate_fraction": round(model.fraction(chosen_at(1.0)), 4),
        "probes": [[round(p["fraction"], 4), round(p["sqnr_db"], 2)] for p in probes],
        "cpu_seconds": round(time.process_time() - start, 1),
    }
    if best is not None:
        estimate.update(
            fraction=round(best["fraction"], 4),
            sqnr_db_calibration=round(best["sqnr_db"], 2),
            sqnr_db_held_out=round(
                model.worst_db(model.rounding(way, best["promoted"]), "held_out"), 2
            ),
            promoted=sorted(best["promoted"]),
        )
    return estimate


def measure(spec, count: int, target: float, work: Path) -> dict:
    model = Model(spec, count, work)
    entry = {"model": spec.name, "settings": SETTINGS[spec.name], "target_sqnr_db": target}
    for way in WAYS:
        entry[way] = search(model, way, target)
    # the estimate against the integer model onebuild builds: all uint8, all int16, and the
    # set the "layer" way chose
    check = {"all uint8": set(), "all int16": None}
    if "promoted" in entry["layer"]:
        check["layer's set"] = set(entry["layer"]["promoted"])
        # the same set with activation-only promotion allowed: what it adds at equal MACs
        entry["value_way_on_layer_set_db"] = round(
            model.worst_db(model.rounding("value", check["layer's set"])), 2
        )
    everything = {n for unit in model.units.values() for n in unit}
    entry["fake_vs_integer"] = {}
    for label, promoted in check.items():
        rounding = model.rounding("layer", everything if promoted is None else promoted)
        integer = model.build(promoted if promoted is None else sorted(promoted))
        entry["fake_vs_integer"][label] = {
            "fake_db": round(model.worst_db(rounding), 2),
            "integer_db": _worst_db(model.float_graph, integer, model.calib),
        }
    for way in WAYS:
        entry[way].pop("promoted", None)
    return entry


def main() -> None:
    global SENSITIVITY_SAMPLES
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="ocr_det,layout_cdla", help="comma-separated names")
    parser.add_argument("--target", type=float, default=30.0, help="target_sqnr_db")
    parser.add_argument("--samples", type=int, default=16, help="samples per set (at most)")
    parser.add_argument("--sensitivity-samples", type=int, default=SENSITIVITY_SAMPLES)
    args = parser.parse_args()
    SENSITIVITY_SAMPLES = args.sensitivity_samples
    wanted = [m for m in args.models.split(",") if m]
    with tempfile.TemporaryDirectory() as folder:
        for spec in [m for m in MODELS if m.name in wanted]:
            print(json.dumps(measure(spec, args.samples, args.target, Path(folder))), flush=True)


if __name__ == "__main__":
    main()
