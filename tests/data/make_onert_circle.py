"""Write tests/data/circle/mlp_onert.circle: a circle written by ONE's own runtime, not by
onebuild (deterministic).

onebuild exports the digits MLP of tests/data/qdq/mlp.onnx to circle; onert 0.1.0's training
API (`onert.experimental.train`) loads it, runs one SGD step and writes the model back with
its own circle exporter (`train_export_circle`), which serializes every table anew (10,116 of
its 10,640 bytes differ from onebuild's file). Two onert faults shape this script: with more
than one trainable operation `train_prepare` crashes on this model, so the weights come back
unchanged; and the Python binding writes the file under a garbled name (the path string is
freed before the exporter opens it), so the script exports in an empty folder and takes the
one file that appears. Run: python tests/data/make_onert_circle.py
"""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
TARGET = HERE / "circle" / "mlp_onert.circle"

EXPORT = """
import sys

import numpy as np
from onert.experimental.train.optimizer.sgd import SGD
from onert.experimental.train.session import TrainSession

session = TrainSession(sys.argv[1], "train")
optimizer = SGD(learning_rate=0.01)
optimizer.nums_trainable_ops = 1
session.compile(optimizer=optimizer, loss="mean_squared_error", batch_size=1)
session.train_step([np.full((1, 64), 0.5, np.float32)], [np.eye(10, dtype=np.float32)[:1]])
session.session.train_export_circle("exported.circle")
"""


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "mlp.circle"
        subprocess.run(
            [sys.executable, "-m", "onebuild.cli", "export", str(HERE / "qdq" / "mlp.onnx"),
             "-o", str(source), "--input-shape", "input=1,64"],
            check=True,
        )  # fmt: skip
        out = Path(folder) / "out"
        out.mkdir()
        subprocess.run([sys.executable, "-c", EXPORT, str(source)], cwd=out, check=True)
        (written,) = os.listdir(out)  # whatever name the binding gave it
        TARGET.parent.mkdir(exist_ok=True)
        shutil.copyfile(out / written, TARGET)
    print(f"wrote {TARGET} ({TARGET.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
