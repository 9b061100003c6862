"""Whether a change to the quantize step's speed kept every output byte: the four real models of
`real_models.py` quantized with mixed precision (int16 at 30 dB, per layer and with
`promote_outputs`; the layout detector with per-channel activations, as `mixed_precision.py`
measures it), each model's IR file bytes and mixed-precision record digested (SHA-256), with
the time each quantization took (file in, model out: wall and CPU seconds).

    python bench/quantize_identity.py --write before.json     # on the old code
    python bench/quantize_identity.py --check before.json     # on the new: exit 1 on a change

Run both with OPENBLAS_NUM_THREADS=1 (as `mixed_precision.py`): threaded BLAS sums in an order
that moves float results by an ulp, which can move a choice.
"""

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

from mixed_precision import _mixed
from real_models import MODELS, fixed_export, samples

from onebuild.compile import optimize
from onebuild.graph_ir.serde import load_onnx, save_ir

OPTIONS = {"layout_cdla": {"activation_granularity": "channel"}}
SETTINGS = {"per_layer": False, "promote_outputs": True}


def digests(spec, count: int, work: Path) -> dict:
    """Per setting: the IR file's and the record's SHA-256, and the (wall, CPU) seconds."""
    path = fixed_export(spec, work)
    calib, _ = samples(spec, count)
    x = optimize(load_onnx(path)).main.inputs[0].name
    entry = {}
    for setting, outputs in SETTINGS.items():
        options = OPTIONS.get(spec.name, {})
        model, seconds = _mixed(path, {x: calib}, 30.0, options, "minmax", None, outputs)
        record = model.metadata["mixed_precision"].encode()
        entry[setting] = {
            "obir_sha256": save_ir(model, work / f"{spec.name}.obir"),
            "record_sha256": hashlib.sha256(record).hexdigest(),
            "seconds": [round(s, 2) for s in seconds],
        }
    return entry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=16, help="calibration samples (at most)")
    parser.add_argument("--models", default="", help="comma-separated names (default: all)")
    parser.add_argument("--write", type=Path, help="write the digests to this JSON file")
    parser.add_argument("--check", type=Path, help="compare with digests written before")
    args = parser.parse_args()
    wanted = {m for m in args.models.split(",") if m}
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        for spec in MODELS:
            if not wanted or spec.name in wanted:
                results[spec.name] = digests(spec, args.samples, Path(folder))
                print(json.dumps({spec.name: results[spec.name]}), flush=True)
    if args.write:
        args.write.write_text(json.dumps(results, indent=2) + "\n")
    if args.check:
        before = json.loads(args.check.read_text())
        changed = [
            f"{model} {setting} {key}"
            for model, entry in results.items()
            for setting, digest in entry.items()
            for key in ("obir_sha256", "record_sha256")
            if before[model][setting][key] != digest[key]
        ]
        print(json.dumps({"identical": not changed, "changed": changed}))
        sys.exit(1 if changed else 0)


if __name__ == "__main__":
    main()
