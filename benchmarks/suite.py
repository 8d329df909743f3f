"""The benchmark suite: the models of TASO's and TENSAT's evaluations, built as ONNX with ``onnx.helper``.

Each builder writes the graph the way PyTorch's ONNX exporter emits the real model (opset 17): convolutions
without bias followed by ``BatchNormalization`` where the model has batch norm, ``Gemm`` for ``nn.Linear``
on 2-D inputs and ``MatMul`` + ``Add`` on 3-D ones, ``LayerNormalization``, ``Softmax``, the erf form of
GELU, ``GlobalAveragePool`` + ``Flatten`` heads, exporter-style names. Nothing is pre-simplified (double
transposes, duplicated pools and the like stay as the model writes them). Static shapes throughout, so the
reshapes take ``Constant`` shapes (what the ``torch.export``-based exporter emits for static shapes).
Weights are random (numpy, a fixed seed): the models are untrained and only their structure matters.

Configurations (``../shared/reference/taso.md``):

============== ==============================================================================================
``bert-b1``    BERT encoder: batch 1, sequence 64, hidden 1024, 16 heads, 8 layers, FFN 4096, additive mask
``bert-b16``   the same encoder at batch 16 (TENSAT's configuration)
``resnext50``  ResNeXt-50 32x4d: 224x224 input, 7x7/2 stem + max pool, stages [3,4,6,3] of widths
               128/256/512/1024 with 32 groups, block output 2x width, 1000 classes
``nasnet-a``   NASNet-A: 224x224 input, 3x3/2 stem + max pool, 3 stages of 5 normal cells with a reduction
               cell between stages, 128 filters doubling per stage, separable conv = Relu, depthwise conv,
               1x1 conv, BatchNormalization
``nasrnn``     NASCell RNN: hidden 512, 5 steps, batch 1; each step 8 x (Gemm(x) + Gemm(h)), then the cell's
               tree of Relu/Sigmoid/Tanh with Add/Mul
``inception3`` Inception-v3 (299x299, blocks A-E, eval mode: no auxiliary head), batch 1
``squeezenet`` SqueezeNet 1.1 (224x224)
``vgg19``      VGG-19 (224x224, 3-layer classifier)
``resnet50``   ResNet-50 as in TASO's example: input (1,64,56,56), no stem, bottleneck stages [3,4,6,3] of
               widths 64/128/256/512 with expansion 4, global average pool and a 1000-way Gemm
============== ==============================================================================================

``suite(quick=False)`` lists them (``quick=True``: tiny widths and inputs with the same structure, for the
smoke test). ``build(name, quick)`` builds one.

    python -m taso_mlir.benchmarks.suite [--quick] [--out DIR] [MODEL ...]   # write the models as .onnx
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np
import onnx
from onnx import TensorProto

from .example_models import ModelGraph

_F = TensorProto.FLOAT
_I64 = TensorProto.INT64
_FMIN = float(np.finfo(np.float32).min)
SEED = 0


class _Shape:
    """A 4-D activation: its value name and its (channels, height, width) at batch ``n``."""

    __slots__ = ("name", "c", "h", "w")

    def __init__(self, name: str, c: int, h: int, w: int):
        self.name, self.c, self.h, self.w = name, c, h, w

    def like(self, name: str, c: Optional[int] = None) -> "_Shape":
        return _Shape(name, self.c if c is None else c, self.h, self.w)


def _pair(k) -> tuple[int, int]:
    return (k, k) if isinstance(k, int) else tuple(k)


def _out(size: int, k: int, s: int, p_total: int, ceil: bool = False) -> int:
    num = size + p_total - k
    return (-(-num // s) if ceil else num // s) + 1


class _Net(ModelGraph):
    """``ModelGraph`` with the layers the CNN builders share."""

    def conv(self, x: _Shape, scope: str, pname: str, cout: int, k, stride=1, pad=None, group: int = 1,
             bias: bool = False) -> _Shape:
        kh, kw = _pair(k)
        sh, sw = _pair(stride)
        ph, pw = (kh // 2, kw // 2) if pad is None else _pair(pad)
        fan_in = (x.c // group) * kh * kw
        w = self.randn(f"{pname}.weight", (cout, x.c // group, kh, kw), math.sqrt(2.0 / fan_in))
        ins = [x.name, w]
        if bias:
            ins.append(self.randn(f"{pname}.bias", (cout,), 0.05))
        y = self.node("Conv", ins, scope, dilations=[1, 1], group=group, kernel_shape=[kh, kw],
                      pads=[ph, pw, ph, pw], strides=[sh, sw])
        return _Shape(y, cout, _out(x.h, kh, sh, 2 * ph), _out(x.w, kw, sw, 2 * pw))

    def bn(self, x: _Shape, scope: str, pname: str, eps: float = 1e-5) -> _Shape:
        c = x.c
        gamma = self.init(f"{pname}.weight", self.rng.uniform(0.5, 1.0, c).astype(np.float32))
        beta = self.init(f"{pname}.bias", (self.rng.standard_normal(c) * 0.1).astype(np.float32))
        mean = self.init(f"{pname}.running_mean", (self.rng.standard_normal(c) * 0.1).astype(np.float32))
        var = self.init(f"{pname}.running_var", self.rng.uniform(0.5, 1.5, c).astype(np.float32))
        return x.like(self.node("BatchNormalization", [x.name, gamma, beta, mean, var], scope, epsilon=eps,
                                momentum=0.9))

    def relu(self, x: _Shape, scope: str) -> _Shape:
        return x.like(self.node("Relu", [x.name], scope))

    def conv_bn(self, x: _Shape, scope: str, conv: str, bn: str, cout: int, k, stride=1, pad=None,
                group: int = 1, relu: bool = True, eps: float = 1e-5) -> _Shape:
        """Conv (no bias) + BatchNormalization [+ Relu]: ``nn.Conv2d(bias=False)``, ``nn.BatchNorm2d``."""
        y = self.conv(x, f"{scope}/{conv.split('.')[-1]}", conv, cout, k, stride, pad, group)
        y = self.bn(y, f"{scope}/{bn.split('.')[-1]}", bn, eps)
        return self.relu(y, f"{scope}/relu") if relu else y

    def pool(self, op: str, x: _Shape, scope: str, k: int, stride: int, pad: int = 0, ceil: bool = False,
             count_include_pad: Optional[int] = None) -> _Shape:
        attrs = dict(ceil_mode=int(ceil), kernel_shape=[k, k], pads=[pad] * 4, strides=[stride, stride])
        if op == "MaxPool":
            attrs["dilations"] = [1, 1]
        else:
            attrs["count_include_pad"] = 1 if count_include_pad is None else count_include_pad
        y = self.node(op, [x.name], scope, **attrs)
        return _Shape(y, x.c, _out(x.h, k, stride, 2 * pad, ceil), _out(x.w, k, stride, 2 * pad, ceil))

    def concat(self, xs: Sequence[_Shape], scope: str) -> _Shape:
        y = self.node("Concat", [x.name for x in xs], scope, axis=1)
        return xs[0].like(y, sum(x.c for x in xs))

    def add(self, a: _Shape, b: _Shape, scope: str) -> _Shape:
        return a.like(self.node("Add", [a.name, b.name], scope))

    def head(self, x: _Shape, classes: int, fc: str = "fc", scope: str = "") -> str:
        """``AdaptiveAvgPool2d(1)`` -> GlobalAveragePool, ``flatten(1)`` -> Flatten, ``nn.Linear`` -> Gemm."""
        y = self.node("GlobalAveragePool", [x.name], f"{scope}/avgpool")
        y = self.node("Flatten", [y], scope, axis=1)
        return self.gemm(y, f"{scope}/{fc}", fc, x.c, classes)

    def gemm(self, x: str, scope: str, pname: str, din: int, dout: int, bias: bool = True) -> str:
        """``nn.Linear`` on a 2-D input as exported: Gemm(x, W, b) with transB=1."""
        w = self.randn(f"{pname}.weight", (dout, din), 1.0 / math.sqrt(din))
        ins = [x, w]
        if bias:
            ins.append(self.randn(f"{pname}.bias", (dout,), 0.05))
        return self.node("Gemm", ins, scope, alpha=1.0, beta=1.0, transB=1)


def _ch(c: float) -> int:
    return max(1, int(round(c)))


# ------------------------------------------------------------------------------------------------
# BERT


def build_bert(batch: int = 1, seq_len: int = 64, hidden: int = 1024, heads: int = 16, layers: int = 8,
               ffn: Optional[int] = None, seed: int = SEED) -> onnx.ModelProto:
    """BERT encoder layers (HuggingFace ``BertEncoder`` as exported), as in TASO's/TENSAT's BERT.

    Inputs ``hidden_states`` float [batch, seq, hidden] (the embeddings' output) and ``attention_mask``
    int64 [batch, seq]; output ``last_hidden_state``. The mask becomes the additive extended mask
    (Unsqueeze, Cast, Sub from 1, Mul by float32 min). Per layer: Q, K, V as MatMul + Add; Reshape to
    heads, Transpose (K: a second Transpose for ``.transpose(-1, -2)``, as the exporter leaves it);
    MatMul; Div by sqrt(head size); Add mask; Softmax; MatMul; Transpose; Reshape; output projection,
    residual Add, LayerNormalization; FFN with erf-GELU; residual Add, LayerNormalization.
    """
    if hidden % heads:
        raise ValueError("hidden must be a multiple of heads")
    ffn = ffn or 4 * hidden
    dh = hidden // heads
    g = ModelGraph(seed)
    x = g.input("hidden_states", _F, [batch, seq_len, hidden])
    mask = g.input("attention_mask", _I64, [batch, seq_len])
    m = g.node("Unsqueeze", [mask, g.const([1, 2])], "")
    m = g.node("Cast", [m], "", to=_F)
    m = g.node("Sub", [g.const(1.0), m], "")
    ext = g.node("Mul", [m, g.const(_FMIN)], "")

    def linear(h, scope, pname, din, dout):
        w = g.randn(g.onnx_name("MatMul"), (din, dout), 1.0 / math.sqrt(din))
        b = g.randn(f"{pname}.bias", (dout,), 0.02)
        return g.node("Add", [b, g.node("MatMul", [h, w], scope)], scope)

    def layer_norm(h, scope, pname):
        gamma = g.init(f"{pname}.weight", g.rng.uniform(0.8, 1.2, hidden).astype(np.float32))
        beta = g.init(f"{pname}.bias", (g.rng.standard_normal(hidden) * 0.02).astype(np.float32))
        return g.node("LayerNormalization", [h, gamma, beta], scope, axis=-1, epsilon=1e-12)

    for li in range(layers):
        sc, pn = f"/encoder/layer.{li}", f"encoder.layer.{li}"
        att, apn = f"{sc}/attention/self", f"{pn}.attention.self"
        q = linear(x, f"{att}/query", f"{apn}.query", hidden, hidden)
        k = linear(x, f"{att}/key", f"{apn}.key", hidden, hidden)
        v = linear(x, f"{att}/value", f"{apn}.value", hidden, hidden)
        split = g.const([batch, seq_len, heads, dh], att)
        qh = g.node("Transpose", [g.node("Reshape", [q, split], att, allowzero=0)], att, perm=[0, 2, 1, 3])
        kh = g.node("Transpose", [g.node("Reshape", [k, split], att, allowzero=0)], att, perm=[0, 2, 1, 3])
        kt = g.node("Transpose", [kh], att, perm=[0, 1, 3, 2])
        vh = g.node("Transpose", [g.node("Reshape", [v, split], att, allowzero=0)], att, perm=[0, 2, 1, 3])
        s = g.node("MatMul", [qh, kt], att)
        s = g.node("Div", [s, g.const(math.sqrt(dh), att)], att)
        s = g.node("Add", [s, ext], att)
        p = g.node("Softmax", [s], att, axis=-1)
        c = g.node("MatMul", [p, vh], att)
        c = g.node("Transpose", [c], att, perm=[0, 2, 1, 3])
        c = g.node("Reshape", [c, g.const([batch, seq_len, hidden], att)], att, allowzero=0)
        o = linear(c, f"{sc}/attention/output/dense", f"{pn}.attention.output.dense", hidden, hidden)
        o = g.node("Add", [o, x], f"{sc}/attention/output")
        x = layer_norm(o, f"{sc}/attention/output/LayerNorm", f"{pn}.attention.output.LayerNorm")
        h = linear(x, f"{sc}/intermediate/dense", f"{pn}.intermediate.dense", hidden, ffn)
        act = f"{sc}/intermediate/intermediate_act_fn"
        e = g.node("Erf", [g.node("Div", [h, g.const(1.4142135381698608, act)], act)], act)
        e = g.node("Mul", [h, g.node("Add", [e, g.const(1.0, act)], act)], act)
        h = g.node("Mul", [e, g.const(0.5, act)], act)
        o = linear(h, f"{sc}/output/dense", f"{pn}.output.dense", ffn, hidden)
        o = g.node("Add", [o, x], f"{sc}/output")
        x = layer_norm(o, f"{sc}/output/LayerNorm", f"{pn}.output.LayerNorm")
    g.output("last_hidden_state", x, _F, [batch, seq_len, hidden])
    return g.model("main_graph")


# ------------------------------------------------------------------------------------------------
# ResNet-50 and ResNeXt-50: bottleneck networks


def build_bottleneck_net(batch: int = 1, image: int = 224, in_channels: int = 3, stem: bool = True,
                         stem_channels: int = 64, widths: Sequence[int] = (64, 128, 256, 512),
                         blocks: Sequence[int] = (3, 4, 6, 3), expansion: int = 4, groups: int = 1,
                         classes: int = 1000, seed: int = SEED) -> onnx.ModelProto:
    """ResNet/ResNeXt with bottleneck blocks (stride on the 3x3 conv, 1x1 strided projection shortcut).

    Block: Conv1x1(width)-BN-Relu, Conv3x3(width, ``groups``, stride)-BN-Relu, Conv1x1(expansion x
    width)-BN, Add(shortcut), Relu. ``stem``: Conv7x7/2(64)-BN-Relu + MaxPool3x3/2. Head: GlobalAveragePool,
    Flatten, Gemm.
    """
    g = _Net(seed)
    x = _Shape(g.input("input", _F, [batch, in_channels, image, image]), in_channels, image, image)
    if stem:
        x = g.conv_bn(x, "", "conv1", "bn1", stem_channels, 7, 2, 3)
        x = g.pool("MaxPool", x, "/maxpool", 3, 2, 1)
    for si, (w, n) in enumerate(zip(widths, blocks)):
        cout = w * expansion
        for bi in range(n):
            stride = 2 if (si > 0 and bi == 0) else 1
            sc, pn = f"/layer{si + 1}/layer{si + 1}.{bi}", f"layer{si + 1}.{bi}"
            y = g.conv_bn(x, sc, f"{pn}.conv1", f"{pn}.bn1", w, 1)
            y = g.conv_bn(y, sc, f"{pn}.conv2", f"{pn}.bn2", w, 3, stride, group=groups)
            y = g.conv_bn(y, sc, f"{pn}.conv3", f"{pn}.bn3", cout, 1, relu=False)
            if stride != 1 or x.c != cout:
                s = g.conv_bn(x, f"{sc}/downsample", f"{pn}.downsample.0", f"{pn}.downsample.1", cout, 1, stride,
                              relu=False)
            else:
                s = x
            x = g.relu(g.add(y, s, sc), f"{sc}/relu_out")
    out = g.head(x, classes)
    g.output("output", out, _F, [batch, classes])
    return g.model("main_graph")


def build_resnet50(batch: int = 1, scale: float = 1.0, image: int = 56, seed: int = SEED) -> onnx.ModelProto:
    """TASO's ResNet-50: input (batch, 64, 56, 56) without the stem; stages [3,4,6,3], widths 64..512 x4."""
    return build_bottleneck_net(batch, image, _ch(64 * scale), stem=False,
                                widths=[_ch(w * scale) for w in (64, 128, 256, 512)], blocks=(3, 4, 6, 3),
                                expansion=4, groups=1, classes=_ch(1000 * scale), seed=seed)


def build_resnext50(batch: int = 1, scale: float = 1.0, image: int = 224, groups: int = 32,
                    seed: int = SEED) -> onnx.ModelProto:
    """ResNeXt-50 32x4d: stem, stages [3,4,6,3] of widths 128..1024 in ``groups`` groups, output 2x width."""
    widths = [max(groups, _ch(w * scale) // groups * groups) for w in (128, 256, 512, 1024)]
    return build_bottleneck_net(batch, image, 3, stem=True, stem_channels=_ch(64 * scale), widths=widths,
                                blocks=(3, 4, 6, 3), expansion=2, groups=groups, classes=_ch(1000 * scale),
                                seed=seed)


# ------------------------------------------------------------------------------------------------
# NASNet-A


def build_nasnet_a(batch: int = 1, image: int = 224, filters: int = 128, cells: int = 5, stages: int = 3,
                   stem_channels: int = 64, classes: int = 1000, seed: int = SEED) -> onnx.ModelProto:
    """NASNet-A (Zoph et al. 2018) with TASO's sizes.

    Stem: Conv3x3/2-BN-Relu, MaxPool3x3/2. ``stages`` stages of ``cells`` normal cells with ``filters``
    filters (doubling per stage); a reduction cell opens every stage after the first. Each cell first
    adjusts both hidden states (h_i: current, h_i-1: previous) to ``filters`` channels with
    Relu-Conv1x1-BN (stride 2 for an h_i-1 of twice the resolution). sep(k) = Relu, depthwise Conv kxk,
    Conv1x1, BN. Normal cell blocks: sep3(h_i) + h_i; sep3(h_i-1) + sep5(h_i); avg3(h_i) + h_i-1;
    avg3(h_i-1) + avg3(h_i-1); sep5(h_i-1) + sep3(h_i-1); output Concat(h_i-1, blocks) (6x filters).
    Reduction cell (stride 2): b1 = sep7(h_i-1) + sep5(h_i); b2 = max3(h_i) + sep7(h_i-1);
    b3 = avg3(h_i) + sep5(h_i-1); b4 = max3(h_i) + sep3(b1, stride 1); b5 = avg3(b1, stride 1) + b2;
    output Concat(b2, b3, b4, b5) (4x filters). Average pools exclude padding (count_include_pad=0).
    Head: Relu, GlobalAveragePool, Flatten, Gemm.
    """
    g = _Net(seed)
    x = _Shape(g.input("input", _F, [batch, 3, image, image]), 3, image, image)
    x = g.conv_bn(x, "/stem", "stem.conv", "stem.bn", stem_channels, 3, 2)
    x = g.pool("MaxPool", x, "/stem/maxpool", 3, 2, 1)

    def adjust(h: _Shape, sc: str, pn: str, f: int, target_hw: int) -> _Shape:
        stride = 2 if h.h == 2 * target_hw else 1
        if h.h not in (target_hw, 2 * target_hw):
            raise ValueError(f"cannot adjust {h.h}x{h.w} to {target_hw}")
        y = g.relu(h, f"{sc}/relu")
        return g.conv_bn(y, sc, f"{pn}.conv", f"{pn}.bn", f, 1, stride, relu=False)

    def sep(h: _Shape, sc: str, pn: str, k: int, stride: int = 1) -> _Shape:
        y = g.relu(h, f"{sc}/relu")
        y = g.conv(y, f"{sc}/depthwise", f"{pn}.depthwise", h.c, k, stride, group=h.c)
        y = g.conv(y, f"{sc}/pointwise", f"{pn}.pointwise", h.c, 1)
        return g.bn(y, f"{sc}/bn", f"{pn}.bn")

    def avg(h: _Shape, sc: str, stride: int = 1) -> _Shape:
        return g.pool("AveragePool", h, sc, 3, stride, 1, count_include_pad=0)

    def normal(prev: _Shape, cur: _Shape, sc: str, pn: str, f: int) -> _Shape:
        c = adjust(cur, f"{sc}/adjust_cur", f"{pn}.adjust_cur", f, cur.h)
        p = adjust(prev, f"{sc}/adjust_prev", f"{pn}.adjust_prev", f, cur.h)
        b1 = g.add(sep(c, f"{sc}/b1/sep3", f"{pn}.b1.sep3", 3), c, f"{sc}/b1")
        b2 = g.add(sep(p, f"{sc}/b2/sep3", f"{pn}.b2.sep3", 3), sep(c, f"{sc}/b2/sep5", f"{pn}.b2.sep5", 5),
                   f"{sc}/b2")
        b3 = g.add(avg(c, f"{sc}/b3/avg"), p, f"{sc}/b3")
        b4 = g.add(avg(p, f"{sc}/b4/avg_a"), avg(p, f"{sc}/b4/avg_b"), f"{sc}/b4")
        b5 = g.add(sep(p, f"{sc}/b5/sep5", f"{pn}.b5.sep5", 5), sep(p, f"{sc}/b5/sep3", f"{pn}.b5.sep3", 3),
                   f"{sc}/b5")
        return g.concat([p, b1, b2, b3, b4, b5], sc)

    def reduction(prev: _Shape, cur: _Shape, sc: str, pn: str, f: int) -> _Shape:
        c = adjust(cur, f"{sc}/adjust_cur", f"{pn}.adjust_cur", f, cur.h)
        p = adjust(prev, f"{sc}/adjust_prev", f"{pn}.adjust_prev", f, cur.h)
        b1 = g.add(sep(p, f"{sc}/b1/sep7", f"{pn}.b1.sep7", 7, 2), sep(c, f"{sc}/b1/sep5", f"{pn}.b1.sep5", 5, 2),
                   f"{sc}/b1")
        b2 = g.add(g.pool("MaxPool", c, f"{sc}/b2/max", 3, 2, 1), sep(p, f"{sc}/b2/sep7", f"{pn}.b2.sep7", 7, 2),
                   f"{sc}/b2")
        b3 = g.add(avg(c, f"{sc}/b3/avg", 2), sep(p, f"{sc}/b3/sep5", f"{pn}.b3.sep5", 5, 2), f"{sc}/b3")
        b4 = g.add(g.pool("MaxPool", c, f"{sc}/b4/max", 3, 2, 1), sep(b1, f"{sc}/b4/sep3", f"{pn}.b4.sep3", 3),
                   f"{sc}/b4")
        b5 = g.add(avg(b1, f"{sc}/b5/avg"), b2, f"{sc}/b5")
        return g.concat([b2, b3, b4, b5], sc)

    prev = cur = x
    f = filters
    ci = 0
    for si in range(stages):
        if si > 0:
            sc, pn = f"/cells/reduction_{si}", f"reduction_{si}"
            prev, cur = cur, reduction(prev, cur, sc, pn, f)
        for _ in range(cells):
            sc, pn = f"/cells/cell_{ci}", f"cell_{ci}"
            prev, cur = cur, normal(prev, cur, sc, pn, f)
            ci += 1
        f *= 2
    y = g.relu(cur, "/relu")
    out = g.head(y, classes, "classifier")
    g.output("output", out, _F, [batch, classes])
    return g.model("main_graph")


# ------------------------------------------------------------------------------------------------
# NasRNN


def build_nasrnn(steps: int = 5, hidden: int = 512, batch: int = 1, seed: int = SEED) -> onnx.ModelProto:
    """An unrolled NASCell RNN (Zoph & Le 2017), as TASO's NasRNN.

    Input ``x`` [steps, batch, hidden]; output ``output`` [steps, batch, hidden] (the h of every step).
    Per step: x_t = Gather(x, t); eight input and eight recurrent projections, each an ``nn.Linear``
    exported as Gemm (transB=1; the recurrent ones without bias; weights shared across steps); the
    cell: l1_k = act_k(ix_k + ih_k) for k != 3 and l1_3 = relu(ix_3 * ih_3) with act = sigmoid, relu,
    sigmoid, -, tanh, sigmoid, tanh, sigmoid; l2_0 = tanh(tanh(l1_0 * l1_1) + c), l2_1 = tanh(l1_2 + l1_3),
    l2_2 = tanh(l1_4 * l1_5), l2_3 = sigmoid(l1_6 + l1_7); c' = l2_0 * l2_1; h' = tanh(c' * tanh(l2_2 + l2_3)).
    Initial h and c are zeros (Constant).
    """
    g = ModelGraph(seed)
    xs = g.input("x", _F, [steps, batch, hidden])
    h = g.const(np.zeros((batch, hidden), np.float32), "/init")
    c = g.const(np.zeros((batch, hidden), np.float32), "/init")
    wx = [g.randn(f"cell.x{k}.weight", (hidden, hidden), 1.0 / math.sqrt(hidden)) for k in range(8)]
    bx = [g.randn(f"cell.x{k}.bias", (hidden,), 0.05) for k in range(8)]
    wh = [g.randn(f"cell.h{k}.weight", (hidden, hidden), 1.0 / math.sqrt(hidden)) for k in range(8)]
    acts = ["Sigmoid", "Relu", "Sigmoid", None, "Tanh", "Sigmoid", "Tanh", "Sigmoid"]
    outs = []
    for t in range(steps):
        sc = f"/step_{t}"
        xt = g.node("Gather", [xs, g.const(t, sc)], sc, axis=0)
        l1 = []
        for k in range(8):
            ix = g.node("Gemm", [xt, wx[k], bx[k]], f"{sc}/x{k}", alpha=1.0, beta=1.0, transB=1)
            ih = g.node("Gemm", [h, wh[k]], f"{sc}/h{k}", alpha=1.0, beta=1.0, transB=1)
            if k == 3:
                l1.append(g.node("Relu", [g.node("Mul", [ix, ih], sc)], sc))
            else:
                l1.append(g.node(acts[k], [g.node("Add", [ix, ih], sc)], sc))
        a = g.node("Tanh", [g.node("Mul", [l1[0], l1[1]], sc)], sc)
        a = g.node("Tanh", [g.node("Add", [a, c], sc)], sc)
        b = g.node("Tanh", [g.node("Add", [l1[2], l1[3]], sc)], sc)
        d = g.node("Tanh", [g.node("Mul", [l1[4], l1[5]], sc)], sc)
        e = g.node("Sigmoid", [g.node("Add", [l1[6], l1[7]], sc)], sc)
        c = g.node("Mul", [a, b], sc)
        h = g.node("Tanh", [g.node("Mul", [c, g.node("Tanh", [g.node("Add", [d, e], sc)], sc)], sc)], sc)
        outs.append(g.node("Unsqueeze", [h, g.const([0], sc)], sc))
    y = g.node("Concat", outs, "", axis=0)
    g.output("output", y, _F, [steps, batch, hidden])
    return g.model("main_graph")


# ------------------------------------------------------------------------------------------------
# Inception-v3


def build_inception_v3(batch: int = 1, image: int = 299, scale: float = 1.0, classes: int = 1000,
                       seed: int = SEED) -> onnx.ModelProto:
    """Inception-v3 (Szegedy et al. 2016) in eval mode (no auxiliary classifier).

    BasicConv2d = Conv (no bias) + BatchNormalization (eps 0.001) + Relu. Stem: 3x3/2 32, 3x3 32,
    3x3 pad 1 64, MaxPool 3x3/2, 1x1 80, 3x3 192, MaxPool 3x3/2. Mixed_5b-d: block A (pool features 32, 64,
    64); Mixed_6a: block B; Mixed_6b-e: block C (7x7 factorised into 1x7 and 7x1; 128, 160, 160, 192
    channels); Mixed_7a: block D; Mixed_7b-c: block E (1x3 / 3x1 branches concatenated). Pool branches of
    A, C, E: AveragePool 3x3 stride 1 pad 1 (count_include_pad=1). Head: GlobalAveragePool, Flatten, Gemm.
    ``scale`` multiplies every channel count (the quick variant).
    """
    g = _Net(seed)
    s = lambda c: _ch(c * scale)  # noqa: E731

    def basic(x: _Shape, name: str, cout: int, k, stride=1, pad=0) -> _Shape:
        return g.conv_bn(x, f"/{name}", f"{name}.conv", f"{name}.bn", s(cout), k, stride, pad, eps=1e-3)

    def avg_branch(x: _Shape, name: str) -> _Shape:
        return g.pool("AveragePool", x, f"/{name}/avg_pool2d", 3, 1, 1, count_include_pad=1)

    x = _Shape(g.input("input", _F, [batch, 3, image, image]), 3, image, image)
    x = basic(x, "Conv2d_1a_3x3", 32, 3, 2)
    x = basic(x, "Conv2d_2a_3x3", 32, 3)
    x = basic(x, "Conv2d_2b_3x3", 64, 3, pad=1)
    x = g.pool("MaxPool", x, "/maxpool1", 3, 2)
    x = basic(x, "Conv2d_3b_1x1", 80, 1)
    x = basic(x, "Conv2d_4a_3x3", 192, 3)
    x = g.pool("MaxPool", x, "/maxpool2", 3, 2)

    for name, pf in (("Mixed_5b", 32), ("Mixed_5c", 64), ("Mixed_5d", 64)):  # block A
        b1 = basic(x, f"{name}.branch1x1", 64, 1)
        b5 = basic(basic(x, f"{name}.branch5x5_1", 48, 1), f"{name}.branch5x5_2", 64, 5, pad=2)
        b3 = basic(x, f"{name}.branch3x3dbl_1", 64, 1)
        b3 = basic(basic(b3, f"{name}.branch3x3dbl_2", 96, 3, pad=1), f"{name}.branch3x3dbl_3", 96, 3, pad=1)
        bp = basic(avg_branch(x, name), f"{name}.branch_pool", pf, 1)
        x = g.concat([b1, b5, b3, bp], f"/{name}")

    name = "Mixed_6a"  # block B
    b3 = basic(x, f"{name}.branch3x3", 384, 3, 2)
    bd = basic(x, f"{name}.branch3x3dbl_1", 64, 1)
    bd = basic(basic(bd, f"{name}.branch3x3dbl_2", 96, 3, pad=1), f"{name}.branch3x3dbl_3", 96, 3, 2)
    bp = g.pool("MaxPool", x, f"/{name}/max_pool2d", 3, 2)
    x = g.concat([b3, bd, bp], f"/{name}")

    for name, c7 in (("Mixed_6b", 128), ("Mixed_6c", 160), ("Mixed_6d", 160), ("Mixed_6e", 192)):  # block C
        b1 = basic(x, f"{name}.branch1x1", 192, 1)
        b7 = basic(x, f"{name}.branch7x7_1", c7, 1)
        b7 = basic(b7, f"{name}.branch7x7_2", c7, (1, 7), pad=(0, 3))
        b7 = basic(b7, f"{name}.branch7x7_3", 192, (7, 1), pad=(3, 0))
        bd = basic(x, f"{name}.branch7x7dbl_1", c7, 1)
        bd = basic(bd, f"{name}.branch7x7dbl_2", c7, (7, 1), pad=(3, 0))
        bd = basic(bd, f"{name}.branch7x7dbl_3", c7, (1, 7), pad=(0, 3))
        bd = basic(bd, f"{name}.branch7x7dbl_4", c7, (7, 1), pad=(3, 0))
        bd = basic(bd, f"{name}.branch7x7dbl_5", 192, (1, 7), pad=(0, 3))
        bp = basic(avg_branch(x, name), f"{name}.branch_pool", 192, 1)
        x = g.concat([b1, b7, bd, bp], f"/{name}")

    name = "Mixed_7a"  # block D
    b3 = basic(basic(x, f"{name}.branch3x3_1", 192, 1), f"{name}.branch3x3_2", 320, 3, 2)
    b7 = basic(x, f"{name}.branch7x7x3_1", 192, 1)
    b7 = basic(b7, f"{name}.branch7x7x3_2", 192, (1, 7), pad=(0, 3))
    b7 = basic(b7, f"{name}.branch7x7x3_3", 192, (7, 1), pad=(3, 0))
    b7 = basic(b7, f"{name}.branch7x7x3_4", 192, 3, 2)
    bp = g.pool("MaxPool", x, f"/{name}/max_pool2d", 3, 2)
    x = g.concat([b3, b7, bp], f"/{name}")

    for name in ("Mixed_7b", "Mixed_7c"):  # block E
        b1 = basic(x, f"{name}.branch1x1", 320, 1)
        b3 = basic(x, f"{name}.branch3x3_1", 384, 1)
        b3 = g.concat([basic(b3, f"{name}.branch3x3_2a", 384, (1, 3), pad=(0, 1)),
                       basic(b3, f"{name}.branch3x3_2b", 384, (3, 1), pad=(1, 0))], f"/{name}/branch3x3")
        bd = basic(basic(x, f"{name}.branch3x3dbl_1", 448, 1), f"{name}.branch3x3dbl_2", 384, 3, pad=1)
        bd = g.concat([basic(bd, f"{name}.branch3x3dbl_3a", 384, (1, 3), pad=(0, 1)),
                       basic(bd, f"{name}.branch3x3dbl_3b", 384, (3, 1), pad=(1, 0))], f"/{name}/branch3x3dbl")
        bp = basic(avg_branch(x, name), f"{name}.branch_pool", 192, 1)
        x = g.concat([b1, b3, bd, bp], f"/{name}")

    out = g.head(x, classes)
    g.output("output", out, _F, [batch, classes])
    return g.model("main_graph")


# ------------------------------------------------------------------------------------------------
# SqueezeNet 1.1 and VGG-19


def build_squeezenet11(batch: int = 1, image: int = 224, scale: float = 1.0, classes: int = 1000,
                       seed: int = SEED) -> onnx.ModelProto:
    """SqueezeNet 1.1 (Iandola et al. 2016): Conv3x3/2 64 + Relu, MaxPool3x3/2 (ceil), 8 Fire modules
    (squeeze 1x1 + Relu; expand 1x1 + Relu and expand 3x3 + Relu, Concat) with ceil-mode max pools after
    Fire 2 and 4; classifier (Dropout is gone in eval mode): Conv1x1 + Relu, GlobalAveragePool, Flatten."""
    g = _Net(seed)
    s = lambda c: _ch(c * scale)  # noqa: E731
    x = _Shape(g.input("input", _F, [batch, 3, image, image]), 3, image, image)
    x = g.relu(g.conv(x, "/features/features.0", "features.0", s(64), 3, 2, 0, bias=True), "/features/features.1")

    def fire(x: _Shape, i: int, sq: int, e1: int, e3: int) -> _Shape:
        sc, pn = f"/features/features.{i}", f"features.{i}"
        y = g.relu(g.conv(x, f"{sc}/squeeze", f"{pn}.squeeze", s(sq), 1, bias=True), f"{sc}/squeeze_activation")
        a = g.relu(g.conv(y, f"{sc}/expand1x1", f"{pn}.expand1x1", s(e1), 1, bias=True),
                   f"{sc}/expand1x1_activation")
        b = g.relu(g.conv(y, f"{sc}/expand3x3", f"{pn}.expand3x3", s(e3), 3, pad=1, bias=True),
                   f"{sc}/expand3x3_activation")
        return g.concat([a, b], sc)

    x = g.pool("MaxPool", x, "/features/features.2", 3, 2, ceil=True)
    x = fire(x, 3, 16, 64, 64)
    x = fire(x, 4, 16, 64, 64)
    x = g.pool("MaxPool", x, "/features/features.5", 3, 2, ceil=True)
    x = fire(x, 6, 32, 128, 128)
    x = fire(x, 7, 32, 128, 128)
    x = g.pool("MaxPool", x, "/features/features.8", 3, 2, ceil=True)
    x = fire(x, 9, 48, 192, 192)
    x = fire(x, 10, 48, 192, 192)
    x = fire(x, 11, 64, 256, 256)
    x = fire(x, 12, 64, 256, 256)
    x = g.relu(g.conv(x, "/classifier/classifier.1", "classifier.1", classes, 1, bias=True), "/classifier/classifier.2")
    y = g.node("GlobalAveragePool", [x.name], "/classifier/classifier.3")
    y = g.node("Flatten", [y], "", axis=1)
    g.output("output", y, _F, [batch, classes])
    return g.model("main_graph")


VGG19 = (64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M")


def build_vgg19(batch: int = 1, image: int = 224, scale: float = 1.0, classes: int = 1000,
                seed: int = SEED) -> onnx.ModelProto:
    """VGG-19 (Simonyan & Zisserman 2014): 16 Conv3x3 (pad 1, bias) + Relu in 5 groups with MaxPool2x2/2;
    AdaptiveAvgPool2d to the 1/32 resolution (7x7 at 224: AveragePool 1x1, as exported); Flatten; classifier
    Gemm 4096 + Relu, Gemm 4096 + Relu, Gemm (Dropout gone in eval mode)."""
    if image % 32:
        raise ValueError("image must be a multiple of 32")
    g = _Net(seed)
    s = lambda c: _ch(c * scale)  # noqa: E731
    x = _Shape(g.input("input", _F, [batch, 3, image, image]), 3, image, image)
    for i, v in enumerate(VGG19):
        sc = f"/features/features.{i}"
        if v == "M":
            x = g.pool("MaxPool", x, sc, 2, 2)
        else:
            x = g.relu(g.conv(x, sc, f"features.{i}", s(v), 3, pad=1, bias=True), sc)
    x = g.pool("AveragePool", x, "/avgpool", 1, 1, count_include_pad=0)
    y = g.node("Flatten", [x.name], "", axis=1)
    hidden = s(4096)
    y = g.node("Relu", [g.gemm(y, "/classifier/classifier.0", "classifier.0", x.c * x.h * x.w, hidden)],
               "/classifier/classifier.1")
    y = g.node("Relu", [g.gemm(y, "/classifier/classifier.3", "classifier.3", hidden, hidden)],
               "/classifier/classifier.4")
    y = g.gemm(y, "/classifier/classifier.6", "classifier.6", hidden, classes)
    g.output("output", y, _F, [batch, classes])
    return g.model("main_graph")


# ------------------------------------------------------------------------------------------------
# the suite


@dataclass(frozen=True)
class SuiteModel:
    name: str
    title: str  # the name in reports and in the published tables
    config: str  # one line: what was built
    build: Callable[[], onnx.ModelProto]


def suite(quick: bool = False) -> list[SuiteModel]:
    """The benchmark models, full size (TASO's configurations) or tiny (``quick``)."""
    if not quick:
        return [
            SuiteModel("bert-b1", "BERT", "8 layers, hidden 1024, 16 heads, seq 64, batch 1",
                       lambda: build_bert(batch=1)),
            SuiteModel("bert-b16", "BERT", "8 layers, hidden 1024, 16 heads, seq 64, batch 16",
                       lambda: build_bert(batch=16)),
            SuiteModel("resnext50", "ResNeXt-50", "32x4d, 1x3x224x224", lambda: build_resnext50()),
            SuiteModel("nasnet-a", "NasNet-A", "3 stages x 5 normal cells, 128 filters, 1x3x224x224",
                       lambda: build_nasnet_a()),
            SuiteModel("nasrnn", "NasRNN", "hidden 512, 5 steps, batch 1", lambda: build_nasrnn()),
            SuiteModel("inception3", "Inception-v3", "1x3x299x299", lambda: build_inception_v3()),
            SuiteModel("squeezenet", "SqueezeNet", "1.1, 1x3x224x224", lambda: build_squeezenet11()),
            SuiteModel("vgg19", "VGG-19", "1x3x224x224", lambda: build_vgg19()),
            SuiteModel("resnet50", "ResNet-50", "TASO's: 1x64x56x56, no stem", lambda: build_resnet50()),
        ]
    return [
        SuiteModel("bert-b1", "BERT", "quick: 2 layers, hidden 32, 4 heads, seq 8, batch 1",
                   lambda: build_bert(batch=1, seq_len=8, hidden=32, heads=4, layers=2)),
        SuiteModel("bert-b16", "BERT", "quick: 2 layers, hidden 32, 4 heads, seq 8, batch 2",
                   lambda: build_bert(batch=2, seq_len=8, hidden=32, heads=4, layers=2)),
        SuiteModel("resnext50", "ResNeXt-50", "quick: widths /16, 4 groups, 1x3x32x32",
                   lambda: build_resnext50(scale=1 / 16, image=32, groups=4)),
        SuiteModel("nasnet-a", "NasNet-A", "quick: 3 stages x 1 normal cell, 8 filters, 1x3x32x32",
                   lambda: build_nasnet_a(image=32, filters=8, cells=1, stem_channels=8, classes=10)),
        SuiteModel("nasrnn", "NasRNN", "quick: hidden 16, 3 steps", lambda: build_nasrnn(steps=3, hidden=16)),
        SuiteModel("inception3", "Inception-v3", "quick: channels /16, 1x3x75x75",
                   lambda: build_inception_v3(image=75, scale=1 / 16, classes=10)),
        SuiteModel("squeezenet", "SqueezeNet", "quick: channels /8, 1x3x64x64",
                   lambda: build_squeezenet11(image=64, scale=1 / 8, classes=10)),
        SuiteModel("vgg19", "VGG-19", "quick: channels /16, 1x3x32x32",
                   lambda: build_vgg19(image=32, scale=1 / 16, classes=10)),
        SuiteModel("resnet50", "ResNet-50", "quick: widths /16, 1x4x16x16",
                   lambda: build_resnet50(scale=1 / 16, image=16)),
    ]


def model_names() -> list[str]:
    return [m.name for m in suite()]


def build(name: str, quick: bool = False) -> onnx.ModelProto:
    for m in suite(quick):
        if m.name == name:
            return m.build()
    raise KeyError(f"unknown model '{name}' (models: {', '.join(model_names())})")


def parameter_count(model: onnx.ModelProto) -> int:
    """Elements of the trainable parameters (initializers other than BatchNorm running statistics), the
    number papers and torchvision quote."""
    skip = ("running_mean", "running_var")
    return sum(int(np.prod(t.dims, dtype=np.int64)) for t in model.graph.initializer
               if t.data_type == TensorProto.FLOAT and not t.name.endswith(skip))


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m taso_mlir.benchmarks.suite",
                                 description="write the benchmark models as ONNX files")
    ap.add_argument("models", nargs="*", help=f"models (default: all): {', '.join(model_names())}")
    ap.add_argument("--quick", action="store_true", help="the tiny variants")
    ap.add_argument("--out", default=".", help="output folder (default: .)")
    a = ap.parse_args(argv)
    from taso_mlir.dialect.onnx_export import save_onnx

    names = a.models or model_names()
    for n in names:
        if n not in model_names():
            sys.stderr.write(f"suite: error: unknown model '{n}' (models: {', '.join(model_names())})\n")
            return 1
    os.makedirs(a.out, exist_ok=True)
    for n in names:
        m = build(n, a.quick)
        onnx.checker.check_model(m, full_check=True)
        path = os.path.join(a.out, f"{n}.onnx")
        save_onnx(m, path)
        print(f"{path}: {len(m.graph.node)} nodes, {parameter_count(m):,} parameters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
