"""The app's view of on-device compilation: load a float package, run it, watch it switch.

    onebuild build examples/digits_odc.toml && python examples/on_device.py [PACKAGE]

The package's config.cfg (see examples/digits_odc.toml) enables auto-compilation, so this is all
the app does: load and run. Restart it and it starts on the NPU model straight away (the
workspace, out/digits_odc.nnpkg.odc/, holds what was recorded and built).
"""

import sys
import time
from pathlib import Path

import numpy as np

from onebuild import Session
from onebuild.npz import read_npz

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "out" / "digits_odc.nnpkg"
DATA = ROOT / "examples" / "digits" / "data"


def main(package: Path) -> int:
    if not package.exists():
        print(f"{package} is missing: run `onebuild build examples/digits_odc.toml` first")
        return 1
    images = read_npz(DATA / "test.npz")["input"]
    labels = read_npz(DATA / "test_labels.npz")["labels"]
    session = Session(package)
    print(f"loaded {package.name}: state {session.state}, {session.minmax_records} runs recorded")
    hits = {}
    for index, (image, label) in enumerate(zip(images, labels)):
        state, start = session.state, time.perf_counter()
        logits = session.run({"input": image})["logits"]  # float32 [1, 10], whatever runs it
        elapsed = (time.perf_counter() - start) * 1e3
        if session.state != state:
            print(f"run {index + 1}: {state} -> {session.state} ({elapsed:.0f} ms incl. compiling)")
            gate = session.gates.get("compiled") or session.gates.get("quantized")
            print(f"  gate: {gate['checks'][0]['check']} = {gate['checks'][0]['value']:.1f}")
        if session.reason:
            print(f"  staying on {session.state}: {session.reason}")
        correct, total = hits.get(state, (0, 0))  # the run's outputs came from `state`
        hits[state] = (correct + int(np.argmax(logits) == label), total + 1)
    for state, (correct, total) in hits.items():
        print(f"{state:>9}: {total:3d} runs, accuracy {correct / total:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else PACKAGE))
