"""Regenerate the PyTorch-exported test models (needs torch; the .onnx files are committed).

    pip install torch==2.13.0 && cd tests/data/torch_exports && python make_exports.py

A MobileNetV2-style CNN (BatchNorm, Relu6, HardSwish, SiLU, depthwise convs, ceil-mode pooling,
bilinear resize, ConvTranspose, GELU) and a self-attention block (LayerNorm, MatMul, Softmax,
shape-computing Reshapes), each exported at opsets 11, 13 and 17 with dynamic axes.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)


class Block(nn.Module):
    def __init__(s, c, e):
        super().__init__()
        s.pw = nn.Conv2d(c, c * e, 1, bias=False)
        s.bn1 = nn.BatchNorm2d(c * e)
        s.dw = nn.Conv2d(c * e, c * e, 3, padding=1, groups=c * e, bias=False)
        s.bn2 = nn.BatchNorm2d(c * e)
        s.pj = nn.Conv2d(c * e, c, 1, bias=False)
        s.bn3 = nn.BatchNorm2d(c)

    def forward(s, x):
        y = F.relu6(s.bn1(s.pw(x)))
        y = F.hardswish(s.bn2(s.dw(y)))
        return x + s.bn3(s.pj(y))


class Net(nn.Module):
    def __init__(s):
        super().__init__()
        s.stem = nn.Conv2d(3, 16, 3, stride=2, padding=1)
        s.bn = nn.BatchNorm2d(16)
        s.b1 = Block(16, 4)
        s.b2 = Block(16, 2)
        s.up = nn.ConvTranspose2d(16, 8, 2, stride=2)
        s.fc = nn.Linear(8, 10)

    def forward(s, x):
        x = F.silu(s.bn(s.stem(x)))
        x = s.b2(s.b1(x))
        x = F.max_pool2d(x, 2, ceil_mode=True)
        x = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)
        x = s.up(x)
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return F.softmax(s.fc(x), dim=-1), F.gelu(x).mean(dim=1, keepdim=True)


class Tiny(nn.Module):  # transformer-ish block
    def __init__(s):
        super().__init__()
        s.ln = nn.LayerNorm(32)
        s.q = nn.Linear(32, 32)
        s.k = nn.Linear(32, 32)
        s.v = nn.Linear(32, 32)
        s.o = nn.Linear(32, 32)

    def forward(s, x):
        h = s.ln(x)
        b, t, c = h.shape
        q = s.q(h).view(b, t, 4, 8).transpose(1, 2)
        k = s.k(h).view(b, t, 4, 8).transpose(1, 2)
        v = s.v(h).view(b, t, 4, 8).transpose(1, 2)
        a = torch.softmax(q @ k.transpose(-1, -2) / 8**0.5, dim=-1) @ v
        return x + s.o(a.transpose(1, 2).reshape(b, t, c))


for name, m, x, dyn in [
    ("cnn", Net().eval(), torch.rand(1, 3, 32, 32), {"x": {0: "batch"}}),
    ("attn", Tiny().eval(), torch.rand(1, 6, 32), {"x": {0: "batch", 1: "seq"}}),
]:
    for opset in (11, 13, 17):
        try:
            torch.onnx.export(
                m,
                (x,),
                f"{name}_op{opset}.onnx",
                input_names=["x"],
                opset_version=opset,
                dynamic_axes=dyn,
                dynamo=False,
            )
            print("ok", name, opset)
        except Exception as e:
            print("fail", name, opset, type(e).__name__, str(e)[:200])
