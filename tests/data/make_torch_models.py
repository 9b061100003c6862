"""Regenerate the control-flow and recurrent models exported by torch.onnx (needs torch; the
.onnx files in tests/data/torch_models/ are committed).

    pip install torch==2.13.0 && python tests/data/make_torch_models.py

Each model is trained briefly on scikit-learn's digits (8x8 images, pixels scaled to [0, 1]),
single-threaded with fixed seeds, so the script writes the same files every run:

- lstm.onnx, gru.onnx: the image read as a sequence of 8 rows (LSTM / GRU, 16 hidden units)
  and a linear classifier on the last hidden state;
- shape_if.onnx: a scripted CNN with `if h.shape[-1] > 4` (a shape check: the exported If's
  condition folds once the input shape is fixed), dynamic batch axis;
- value_if.onnx: a scripted CNN that takes one of two branches by the image's mean ink
  (`if x.mean() > INK`, INK the median over the dataset, so real images take both), each branch
  a 1x1 convolution whose weights the exported If's branches read from the outer graph;
- hardswish_se.onnx: a MobileNetV3-style block (hard-swish, depthwise convolution,
  squeeze-excitation with a hard-sigmoid gate, residual Add) exported at opset 13, where torch
  spells nn.Hardswish as x * HardSigmoid(x): what O1's pattern fusion and the NPU must take.
"""

from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
from sklearn.datasets import load_digits

FOLDER = Path(__file__).parent / "torch_models"
OPSET = 17


def digits() -> tuple[torch.Tensor, torch.Tensor]:
    data = load_digits()
    images = torch.tensor(data.images / 16.0, dtype=torch.float32).unsqueeze(1)
    return images, torch.tensor(data.target)


IMAGES, LABELS = digits()
INK = float(IMAGES.mean(dim=(1, 2, 3)).median())


class Recurrent(nn.Module):
    def __init__(self, cell: type[nn.Module]):
        super().__init__()
        self.rnn = cell(8, 16, batch_first=True)
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(x[:, 0])
        return self.head(out[:, -1])


class ShapeIf(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.head = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x)
        if h.shape[-1] > 4:  # noqa: SIM108  (the statement torch.jit.script exports as If)
            h = torch.max_pool2d(torch.relu(h), 2)
        else:
            h = torch.relu(h)
        return self.head(h.flatten(1))


class ValueIf(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.light = nn.Conv2d(8, 8, 1)
        self.heavy = nn.Conv2d(8, 8, 1)
        self.head = nn.Linear(8 * 8 * 8, 10)
        self.ink = INK

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv(x))
        if bool(x.mean() > self.ink):
            h = torch.tanh(self.heavy(h))
        else:
            h = torch.sigmoid(self.light(h)) * 2.0
        return self.head(h.flatten(1))


class HardSwishSE(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.Hardswish())
        self.depthwise = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.Hardswish())
        self.excite = nn.Sequential(
            nn.AdaptiveAvgPool2d(1),
            nn.Conv2d(16, 4, 1),
            nn.ReLU(),
            nn.Conv2d(4, 16, 1),
            nn.Hardsigmoid(),
        )
        self.project = nn.Conv2d(16, 16, 1)
        self.head = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        y = self.depthwise(h)
        y = self.project(y * self.excite(y)) + h
        return self.head(torch.max_pool2d(y, 2).flatten(1))


def train(model: nn.Module, epochs: int, batch: int = 1) -> nn.Module:
    """A few epochs of Adam on the digits (per-sample batches where control flow depends on
    the sample)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    order = torch.randperm(len(IMAGES))
    for _ in range(epochs):
        for start in range(0, len(order), batch):
            index = order[start : start + batch]
            loss = nn.functional.cross_entropy(model(IMAGES[index]), LABELS[index])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.eval()
    with torch.no_grad():
        correct = sum(int(model(IMAGES[i : i + 1]).argmax()) == int(LABELS[i]) for i in order)
    print(f"{type(model).__name__}: train accuracy {correct / len(order):.3f}")
    return model


def export(model: nn.Module, name: str, dynamic: bool = False, opset: int = OPSET) -> None:
    axes = {"x": {0: "n"}, "y": {0: "n"}} if dynamic else None
    FOLDER.mkdir(exist_ok=True)
    torch.onnx.export(
        model,
        (IMAGES[:1],),
        str(FOLDER / f"{name}.onnx"),
        dynamo=False,
        opset_version=opset,
        input_names=["x"],
        output_names=["y"],
        dynamic_axes=axes,
    )


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    np.random.seed(0)
    export(train(Recurrent(nn.LSTM), epochs=3, batch=32), "lstm")
    export(train(Recurrent(nn.GRU), epochs=3, batch=32), "gru")
    export(torch.jit.script(train(ShapeIf(), epochs=3, batch=32)), "shape_if", dynamic=True)
    export(torch.jit.script(train(ValueIf(), epochs=1)), "value_if")
    export(train(HardSwishSE(), epochs=3, batch=32), "hardswish_se", opset=13)


if __name__ == "__main__":
    main()
