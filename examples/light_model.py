"""Write one of onnx's light architectures with seeded random weights, plus a batch of inputs.

python examples/light_model.py resnet50 out/
onebuild run out/resnet50.onnx -i out/resnet50_inputs.npz -o out/resnet50_outputs.npz
"""

import argparse
from pathlib import Path

import numpy as np
import onnx

from onebuild.graph_ir.serde.model_zoo import LIGHT_MODELS, light_model
from onebuild.npz import write_npz


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=LIGHT_MODELS)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    proto = light_model(args.name, seed=args.seed)
    args.folder.mkdir(parents=True, exist_ok=True)
    onnx.save(proto, args.folder / f"{args.name}.onnx")
    rng = np.random.default_rng(args.seed)
    inputs = {}
    initializers = {t.name for t in proto.graph.initializer}
    for info in proto.graph.input:
        if info.name in initializers:
            continue
        shape = [d.dim_value for d in info.type.tensor_type.shape.dim]
        inputs[info.name] = rng.random((args.samples, *shape), dtype=np.float32)
    write_npz(args.folder / f"{args.name}_inputs.npz", inputs)
    print(f"wrote {args.folder / args.name}.onnx and {args.name}_inputs.npz")


if __name__ == "__main__":
    main()
