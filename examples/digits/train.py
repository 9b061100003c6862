"""Train the digits example model and write it with its data. Deterministic; numpy only.

    python examples/digits/train.py        # rewrites examples/digits/{digits.onnx,data/*.npz}

A small CNN (Conv 3x3 -> Relu -> MaxPool -> Conv 3x3 -> Relu -> MaxPool -> Gemm) trained with
Adam on scikit-learn's bundled 8x8 digits (1797 images, 10 classes), exported to ONNX (opset 13,
dynamic batch). Data files follow the npz convention: `input` is [N, 1, 1, 8, 8] float32 in
[0, 1]; labels are separate (`labels`, [N] int64).
  data/calib.npz  200 training images, for quantization calibration
  data/eval.npz   200 held-out images, for accuracy gates
  data/test.npz   the 360 test images; data/test_labels.npz their labels
"""

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from sklearn.datasets import load_digits

from onebuild.npz import write_npz

HERE = Path(__file__).parent
SEED = 20261121


def im2col(x: np.ndarray) -> np.ndarray:
    """[N, C, H, W] -> [N, C*9, H*W] for a 3x3 kernel, stride 1, padding 1."""
    n, c, h, w = x.shape
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    cols = np.empty((n, c, 3, 3, h, w), x.dtype)
    for i in range(3):
        for j in range(3):
            cols[:, :, i, j] = padded[:, :, i : i + h, j : j + w]
    return cols.reshape(n, c * 9, h * w)


def col2im(cols: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    n, c, h, w = shape
    cols = cols.reshape(n, c, 3, 3, h, w)
    padded = np.zeros((n, c, h + 2, w + 2), cols.dtype)
    for i in range(3):
        for j in range(3):
            padded[:, :, i : i + h, j : j + w] += cols[:, :, i, j]
    return padded[:, :, 1:-1, 1:-1]


class Net:
    """Parameters and a forward/backward pass written out by hand."""

    def __init__(self, rng: np.random.Generator):
        def he(*shape):
            return rng.normal(0, np.sqrt(2 / np.prod(shape[1:])), shape).astype(np.float32)

        self.params = {
            "w1": he(8, 1, 3, 3),
            "b1": np.zeros(8, np.float32),
            "w2": he(16, 8, 3, 3),
            "b2": np.zeros(16, np.float32),
            "w3": he(10, 64),
            "b3": np.zeros(10, np.float32),
        }

    @staticmethod
    def _conv(x, w, b):
        cols = im2col(x)
        y = np.matmul(w.reshape(w.shape[0], -1), cols) + b[:, None]
        return y.reshape(x.shape[0], w.shape[0], *x.shape[2:]), cols

    @staticmethod
    def _pool(x):
        n, c, h, w = x.shape
        blocks = x.reshape(n, c, h // 2, 2, w // 2, 2)
        y = blocks.max(axis=(3, 5))
        mask = blocks == y[:, :, :, None, :, None]
        return y, mask

    def loss_and_grads(self, x, labels):
        p = self.params
        a1, cols1 = self._conv(x, p["w1"], p["b1"])
        r1 = np.maximum(a1, 0)
        p1, m1 = self._pool(r1)
        a2, cols2 = self._conv(p1, p["w2"], p["b2"])
        r2 = np.maximum(a2, 0)
        p2, m2 = self._pool(r2)
        flat = p2.reshape(len(x), -1)
        logits = flat @ p["w3"].T + p["b3"]
        shifted = logits - logits.max(axis=1, keepdims=True)
        probs = np.exp(shifted) / np.exp(shifted).sum(axis=1, keepdims=True)
        loss = -np.log(probs[np.arange(len(x)), labels] + 1e-12).mean()
        d_logits = probs
        d_logits[np.arange(len(x)), labels] -= 1
        d_logits /= len(x)
        grads = {"w3": d_logits.T @ flat, "b3": d_logits.sum(0)}
        d_p2 = (d_logits @ p["w3"]).reshape(p2.shape)
        d_r2 = (m2 * d_p2[:, :, :, None, :, None]).reshape(r2.shape) * (a2 > 0)
        grads["w2"] = np.einsum("nop,nkp->ok", d_r2.reshape(len(x), 16, -1), cols2).reshape(
            p["w2"].shape
        )
        grads["b2"] = d_r2.sum((0, 2, 3))
        d_cols2 = np.matmul(p["w2"].reshape(16, -1).T, d_r2.reshape(len(x), 16, -1))
        d_p1 = col2im(d_cols2, p1.shape)
        d_r1 = (m1 * d_p1[:, :, :, None, :, None]).reshape(r1.shape) * (a1 > 0)
        grads["w1"] = np.einsum("nop,nkp->ok", d_r1.reshape(len(x), 8, -1), cols1).reshape(
            p["w1"].shape
        )
        grads["b1"] = d_r1.sum((0, 2, 3))
        return loss, logits, grads


def train(x, y, rng, epochs=40, batch=32, lr=3e-3) -> Net:
    net = Net(rng)
    moments = {k: (np.zeros_like(v), np.zeros_like(v)) for k, v in net.params.items()}
    step = 0
    for _ in range(epochs):
        order = rng.permutation(len(x))
        for start in range(0, len(x), batch):
            index = order[start : start + batch]
            _, _, grads = net.loss_and_grads(x[index], y[index])
            step += 1
            for name, grad in grads.items():
                m, v = moments[name]
                m[:] = 0.9 * m + 0.1 * grad
                v[:] = 0.999 * v + 0.001 * grad * grad
                m_hat, v_hat = m / (1 - 0.9**step), v / (1 - 0.999**step)
                net.params[name] -= (lr * m_hat / (np.sqrt(v_hat) + 1e-8)).astype(np.float32)
    return net


def export(net: Net, path: Path) -> None:
    p = net.params
    nodes = [
        helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node(
            "MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2], name="pool1"
        ),
        helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node(
            "MaxPool", ["r2"], ["p2"], kernel_shape=[2, 2], strides=[2, 2], name="pool2"
        ),
        helper.make_node("Flatten", ["p2"], ["flat"], axis=1, name="flatten"),
        helper.make_node("Gemm", ["flat", "w3", "b3"], ["logits"], transB=1, name="fc"),
    ]
    graph = helper.make_graph(
        nodes,
        "digits",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(v, k) for k, v in sorted(p.items())],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="onebuild-digits-example"
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)


def main() -> None:
    rng = np.random.default_rng(SEED)
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None]  # [N, 1, 8, 8]
    labels = digits.target.astype(np.int64)
    order = rng.permutation(len(images))
    test, train_index = order[:360], order[360:]
    net = train(images[train_index], labels[train_index], rng)
    _, logits, _ = net.loss_and_grads(images[test], labels[test])
    accuracy = float((logits.argmax(1) == labels[test]).mean())
    export(net, HERE / "digits.onnx")
    data = HERE / "data"
    data.mkdir(exist_ok=True)
    calib, evaluation = train_index[:200], train_index[200:400]
    write_npz(data / "calib.npz", {"input": images[calib][:, None]})
    write_npz(data / "eval.npz", {"input": images[evaluation][:, None]})
    write_npz(data / "test.npz", {"input": images[test][:, None]})
    write_npz(data / "test_labels.npz", {"labels": labels[test]})
    print(f"float test accuracy {accuracy:.4f} on {len(test)} images")


if __name__ == "__main__":
    main()
