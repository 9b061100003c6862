"""Train the recurrent digit classifiers and write them with their data. Deterministic; numpy only.

    python examples/recurrent/train.py     # rewrites examples/recurrent/{*.onnx,data/*.npz}

Each 8x8 digit of scikit-learn's bundled set (1797 images, 10 classes) is read as a sequence of
8 rows of 8 pixels (scaled to [0, 1]). One recurrent layer (LSTM, GRU or RNN with ONNX's default
activations, 24 units, forward or bidirectional) reads it; its final hidden state(s) feed a
Gemm to 10 logits. Trained by backpropagation through time with Adam. Exported to ONNX (opset
14) with input `x` [8, 1, 8] and outputs `logits` [1, 10] and `Y` (every hidden state, for state
SQNR); onnxruntime must reproduce the numpy forward pass before a file is written.
  data/calib.npz  200 training sequences, for quantization calibration ([N, 8, 1, 8])
  data/test.npz   the 360 test sequences; data/test_labels.npz their labels
"""

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from sklearn.datasets import load_digits

from onebuild.npz import write_npz

HERE = Path(__file__).parent
SEED = 20261122
HIDDEN = 24
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
MODELS = [(op, direction) for op in GATES for direction in ("forward", "bidirectional")]


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _step(op, p, x, state):
    """One step of one direction; returns the new state and what the backward pass needs."""
    w, r, b, size = p["W"], p["R"], p["b"], HIDDEN
    if op == "LSTM":
        h, c = state
        a = x @ w.T + h @ r.T + b
        i, o, f = (_sigmoid(a[:, k * size : (k + 1) * size]) for k in range(3))
        g = np.tanh(a[:, 3 * size :])
        c2 = f * c + i * g
        tc = np.tanh(c2)
        return (o * tc, c2), (x, h, c, i, o, f, g, tc)
    if op == "GRU":
        (h,) = state
        a = x @ w[: 2 * size].T + h @ r[: 2 * size].T + b[: 2 * size]
        z, reset = _sigmoid(a[:, :size]), _sigmoid(a[:, size:])
        n = np.tanh(x @ w[2 * size :].T + (reset * h) @ r[2 * size :].T + b[2 * size :])
        return ((1 - z) * n + z * h,), (x, h, z, reset, n)
    (h,) = state
    h2 = np.tanh(x @ w.T + h @ r.T + b)
    return (h2,), (x, h, h2)


def _back(op, p, cache, d_state, grads):
    """Accumulate one step's gradients; returns the gradient of the previous state."""
    r, size = p["R"], HIDDEN
    if op == "LSTM":
        x, h, c, i, o, f, g, tc = cache
        dh, dc = d_state
        dc = dc + dh * o * (1 - tc**2)
        da = np.concatenate(
            [
                dc * g * i * (1 - i),
                dh * tc * o * (1 - o),
                dc * c * f * (1 - f),
                dc * i * (1 - g**2),
            ],
            axis=1,
        )
        grads["R"] += da.T @ h
        prev = (da @ r, dc * f)
    elif op == "GRU":
        x, h, z, reset, n = cache
        (dh,) = d_state
        dan = dh * (1 - z) * (1 - n**2)
        drh = dan @ r[2 * size :]
        daz, dar = dh * (h - n) * z * (1 - z), drh * h * reset * (1 - reset)
        da = np.concatenate([daz, dar, dan], axis=1)
        grads["R"][: 2 * size] += da[:, : 2 * size].T @ h
        grads["R"][2 * size :] += dan.T @ (reset * h)
        prev = (dh * z + drh * reset + da[:, : 2 * size] @ r[: 2 * size],)
    else:
        x, h, h2 = cache
        da = d_state[0] * (1 - h2**2)
        grads["R"] += da.T @ h
        prev = (da @ r,)
    grads["W"] += da.T @ x
    grads["b"] += da.sum(axis=0)
    return prev


def _forward(op, params, x):
    """x [T, N, 8] -> logits, the final states and the caches of every direction."""
    finals, caches = [], []
    for d, p in enumerate(params["dirs"]):
        steps = x if d == 0 else x[::-1]
        state = tuple(np.zeros((x.shape[1], HIDDEN)) for _ in range(2 if op == "LSTM" else 1))
        cache = []
        for xt in steps:
            state, c = _step(op, p, xt, state)
            cache.append(c)
        finals.append(state[0])
        caches.append(cache)
    features = np.concatenate(finals, axis=1)
    return features @ params["fc"] + params["fb"], features, caches


def _loss_and_grads(op, params, x, labels):
    logits, features, caches = _forward(op, params, x)
    shifted = logits - logits.max(axis=1, keepdims=True)
    prob = np.exp(shifted) / np.exp(shifted).sum(axis=1, keepdims=True)
    loss = -np.log(prob[np.arange(len(labels)), labels]).mean()
    dlogits = prob
    dlogits[np.arange(len(labels)), labels] -= 1
    dlogits /= len(labels)
    grads = {"fc": features.T @ dlogits, "fb": dlogits.sum(axis=0), "dirs": []}
    dfeatures = dlogits @ params["fc"].T
    for d, (p, cache) in enumerate(zip(params["dirs"], caches)):
        g = {k: np.zeros_like(v) for k, v in p.items()}
        dh = dfeatures[:, d * HIDDEN : (d + 1) * HIDDEN]
        d_state = (dh, np.zeros_like(dh)) if op == "LSTM" else (dh,)
        for c in reversed(cache):
            d_state = _back(op, p, c, d_state, g)
        grads["dirs"].append(g)
    return loss, grads


def _flat(tree) -> list[np.ndarray]:
    return [tree["fc"], tree["fb"], *(d[k] for d in tree["dirs"] for k in ("W", "R", "b"))]


def train(op, direction, x, labels, rng, epochs=40, batch=32, lr=0.01):
    dirs = 2 if direction == "bidirectional" else 1
    rows = GATES[op] * HIDDEN
    params = {
        "dirs": [
            {
                "W": rng.normal(0, 1 / np.sqrt(8), (rows, 8)),
                "R": rng.normal(0, 1 / np.sqrt(HIDDEN), (rows, HIDDEN)),
                "b": np.zeros(rows),
            }
            for _ in range(dirs)
        ],
        "fc": rng.normal(0, 1 / np.sqrt(dirs * HIDDEN), (dirs * HIDDEN, 10)),
        "fb": np.zeros(10),
    }
    values = _flat(params)
    moments = [(np.zeros_like(v), np.zeros_like(v)) for v in values]
    step = 0
    for _ in range(epochs):
        order = rng.permutation(x.shape[1])
        for start in range(0, len(order), batch):
            part = order[start : start + batch]
            _, grads = _loss_and_grads(op, params, x[:, part], labels[part])
            step += 1
            for v, g, (m, s) in zip(values, _flat(grads), moments):
                m[...] = 0.9 * m + 0.1 * g
                s[...] = 0.999 * s + 0.001 * g**2
                v -= lr * (m / (1 - 0.9**step)) / (np.sqrt(s / (1 - 0.999**step)) + 1e-8)
    return params


def export(op, direction, params, path: Path) -> None:
    dirs = len(params["dirs"])
    weights = {
        "W": np.stack([p["W"] for p in params["dirs"]]),
        "R": np.stack([p["R"] for p in params["dirs"]]),
        "B": np.stack([np.concatenate([p["b"], np.zeros_like(p["b"])]) for p in params["dirs"]]),
        "fc": params["fc"],
        "fb": params["fb"],
        "shape": np.array([1, dirs * HIDDEN], np.int64),
    }
    nodes = [
        helper.make_node(op, ["x", "W", "R", "B"], ["Y", "Y_h"], name=op.lower(),
                         hidden_size=HIDDEN, direction=direction),
        helper.make_node("Transpose", ["Y_h"], ["h_t"], perm=[1, 0, 2], name="batch_major"),
        helper.make_node("Reshape", ["h_t", "shape"], ["features"], name="features"),
        helper.make_node("Gemm", ["features", "fc", "fb"], ["logits"], name="fc"),
    ]  # fmt: skip
    graph = helper.make_graph(
        nodes,
        f"digits_{op.lower()}_{direction}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 1, 8])],
        [
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10]),
            helper.make_tensor_value_info("Y", TensorProto.FLOAT, [8, dirs, 1, HIDDEN]),
        ],
        [
            numpy_helper.from_array(v if v.dtype == np.int64 else v.astype(np.float32), k)
            for k, v in weights.items()
        ],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 14)], producer_name="onebuild-recurrent"
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)


def check_export(op, params, path: Path, x: np.ndarray) -> None:
    """onnxruntime on the file reproduces the numpy forward pass (the export is faithful)."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for n in range(8):
        (got,) = session.run(["logits"], {"x": x[:, n : n + 1].astype(np.float32)})
        expected = _forward(op, params, x[:, n : n + 1])[0]
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def main() -> None:
    rng = np.random.default_rng(SEED)
    digits = load_digits()
    sequences = (digits.images / 16.0).transpose(1, 0, 2)  # [8 rows, N, 8 pixels]
    labels = digits.target.astype(np.int64)
    order = rng.permutation(len(labels))
    test, train_index = order[:360], order[360:]
    for op, direction in MODELS:
        params = train(op, direction, sequences[:, train_index], labels[train_index], rng)
        logits = _forward(op, params, sequences[:, test])[0]
        accuracy = float((logits.argmax(1) == labels[test]).mean())
        path = HERE / f"{op.lower()}_{direction}.onnx"
        export(op, direction, params, path)
        check_export(op, params, path, sequences[:, test])
        print(f"{path.name}: float test accuracy {accuracy:.4f} on {len(test)} sequences")
    data = HERE / "data"
    data.mkdir(exist_ok=True)
    as_samples = sequences.transpose(1, 0, 2)[:, :, None].astype(np.float32)  # [N, 8, 1, 8]
    write_npz(data / "calib.npz", {"x": as_samples[train_index[:200]]})
    write_npz(data / "test.npz", {"x": as_samples[test]})
    write_npz(data / "test_labels.npz", {"labels": labels[test]})


if __name__ == "__main__":
    main()
