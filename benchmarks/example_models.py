"""Small example models shaped like what PyTorch's ONNX exporter emits (opset 17, IR version 8).

Three builders, each taking size parameters so that tests can build a tiny version and a large one:

- ``build_cnn``: ResNet/ResNeXt/MobileNet-style blocks (Conv + BatchNormalization + Relu, strided,
  grouped and depthwise convolutions, residual Add), MaxPool, GlobalAveragePool, Flatten, Gemm.
- ``build_transformer``: a BERT-style encoder (Gather embeddings over int64 ids, position ids through
  Shape -> Gather -> Unsqueeze -> Slice, Expand, MatMul + Add projections, fused QKV with Split,
  Reshape/Transpose into heads with shapes computed by Shape -> Gather -> Unsqueeze -> Concat, batched
  MatMul, Div / Mul scaling, a Where mask, Softmax, Erf-based GELU, LayerNormalization, Identity and
  Constant nodes, a Gemm + Tanh + Clip pooler).
- ``build_inception``: Inception-like blocks (four branches joined by Concat, AveragePool with
  ``count_include_pad=1``, convolutions and pools with ``auto_pad=SAME_UPPER`` on odd sizes).

Weights are numpy random with a fixed seed. Names follow the exporter's habits: node names like
``/layer1/layer1.0/conv1/Conv``, values like ``/layer1/layer1.0/conv1/Conv_output_0``, parameters like
``layer1.0.conv1.weight`` and transposed MatMul weights like ``onnx::MatMul_123``.

``write_example_models()`` regenerates the bundled ``models/example_cnn.onnx``;
``random_inputs(model)`` makes valid random feeds for any of these models.

    python -m taso_mlir.benchmarks.example_models     # rewrite benchmarks/models/example_cnn.onnx
"""

from __future__ import annotations

import math
import os
from typing import Optional, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8
MODELS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models")
EXAMPLE_CNN = os.path.join(MODELS_DIR, "example_cnn.onnx")

_F = TensorProto.FLOAT
_I64 = TensorProto.INT64
#: The additive "minus infinity" PyTorch uses for masks (torch.finfo(torch.float32).min).
_FMIN = float(np.finfo(np.float32).min)


class ModelGraph:
    """A tiny graph builder with PyTorch-exporter naming (scoped node names, ``_output_0`` values)."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._node_names: dict[str, int] = {}
        self._onnx_ids = 0

    # ---- names
    def _node_name(self, scope: str, op_type: str) -> str:
        base = f"{scope}/{op_type}"
        i = self._node_names.get(base, 0)
        self._node_names[base] = i + 1
        return base if i == 0 else f"{base}_{i}"

    def onnx_name(self, kind: str) -> str:
        """The exporter's names for anonymous parameters, e.g. ``onnx::MatMul_123``."""
        self._onnx_ids += 1
        return f"onnx::{kind}_{100 + self._onnx_ids}"

    # ---- graph pieces
    def node(self, op_type: str, inputs: Sequence[str], scope: str = "", n_out: int = 1,
             domain: Optional[str] = None, **attrs):
        name = self._node_name(scope, op_type)
        outs = [f"{name}_output_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=name, domain=domain, **attrs))
        return outs[0] if n_out == 1 else outs

    def const(self, value, scope: str = "", dtype=None) -> str:
        """A ``Constant`` node (the exporter's spelling of scalars, axes and shape pieces)."""
        arr = np.array(value, dtype=dtype if dtype is not None else
                       (np.int64 if np.asarray(value).dtype.kind in "iu" else np.float32))
        return self.node("Constant", [], scope, value=numpy_helper.from_array(arr))

    def init(self, name: str, arr: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
        return name

    def randn(self, name: str, shape, std: float) -> str:
        return self.init(name, (self.rng.standard_normal(shape) * std).astype(np.float32))

    def input(self, name: str, elem: int, shape) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem, shape))
        return name

    def output(self, name: str, src: str, elem: int, shape) -> str:
        """Make ``src`` the graph output ``name`` (renaming the producing node's output)."""
        for n in self.nodes:
            for i, o in enumerate(n.output):
                if o == src:
                    n.output[i] = name
            for i, x in enumerate(n.input):
                if x == src:
                    n.input[i] = name
        self.outputs.append(helper.make_tensor_value_info(name, elem, shape))
        return name

    def model(self, graph_name: str) -> onnx.ModelProto:
        g = helper.make_graph(self.nodes, graph_name, self.inputs, self.outputs, self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="pytorch", producer_version="2.4.0")
        m.ir_version = IR_VERSION
        return m


def _batch_dim(batch: int, dynamic_batch: bool):
    return "batch_size" if dynamic_batch else batch


# ------------------------------------------------------------------------------------------------
# (a) CNN


def _conv_bn(g: ModelGraph, x: str, scope: str, pname: str, cin: int, cout: int, k: int, stride: int = 1,
             group: int = 1, relu: bool = True) -> str:
    """Conv (no bias, as exported from ``nn.Conv2d(bias=False)``) + BatchNormalization [+ Relu]."""
    fan_in = (cin // group) * k * k
    w = g.randn(f"{pname}.weight", (cout, cin // group, k, k), math.sqrt(2.0 / fan_in))
    y = g.node("Conv", [x, w], f"{scope}/{pname.split('.')[-1]}", dilations=[1, 1], group=group,
               kernel_shape=[k, k], pads=[k // 2] * 4, strides=[stride, stride])
    bn = pname.replace("conv", "bn") if "conv" in pname else pname + "_bn"
    gamma = g.init(f"{bn}.weight", g.rng.uniform(0.5, 1.0, cout).astype(np.float32))
    beta = g.init(f"{bn}.bias", (g.rng.standard_normal(cout) * 0.1).astype(np.float32))
    mean = g.init(f"{bn}.running_mean", (g.rng.standard_normal(cout) * 0.1).astype(np.float32))
    var = g.init(f"{bn}.running_var", g.rng.uniform(0.5, 1.5, cout).astype(np.float32))
    y = g.node("BatchNormalization", [y, gamma, beta, mean, var], f"{scope}/{bn.split('.')[-1]}",
               epsilon=1e-5, momentum=0.9)
    if relu:
        y = g.node("Relu", [y], f"{scope}/relu")
    return y


def build_cnn(batch: int = 1, image_size: int | tuple[int, int] = 32, in_channels: int = 3,
              widths: Sequence[int] = (16, 32, 64), blocks: int | Sequence[int] = 1, groups: int = 4,
              num_classes: int = 10, seed: int = 0, dynamic_batch: bool = False) -> onnx.ModelProto:
    """A ResNeXt/MobileNet-flavoured CNN.

    stem: Conv3x3 + BN + Relu, MaxPool 3x3/2 (pad 1); per stage (``widths``), ``blocks`` blocks of
    Conv1x1-BN-Relu, grouped Conv3x3 (stride 2 on the first block of stages after the first)-BN-Relu,
    depthwise Conv3x3-BN-Relu, Conv1x1-BN, a (projected when needed) shortcut, Add, Relu; head:
    GlobalAveragePool, Flatten, Gemm. Weights: about ``4 * sum(3.2 * w**2)`` bytes per block.
    """
    g = ModelGraph(seed)
    hw = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    nblocks = [blocks] * len(widths) if isinstance(blocks, int) else list(blocks)
    for w in widths:
        if w % groups:
            raise ValueError(f"width {w} is not a multiple of groups={groups}")
    x = g.input("input", _F, [_batch_dim(batch, dynamic_batch), in_channels, hw[0], hw[1]])
    x = _conv_bn(g, x, "", "conv1", in_channels, widths[0], 3)
    x = g.node("MaxPool", [x], "/maxpool", ceil_mode=0, dilations=[1, 1], kernel_shape=[3, 3],
               pads=[1, 1, 1, 1], strides=[2, 2])
    cin = widths[0]
    for si, (w, nb) in enumerate(zip(widths, nblocks)):
        for bi in range(nb):
            stride = 2 if (si > 0 and bi == 0) else 1
            layer = f"layer{si + 1}"
            scope = f"/{layer}/{layer}.{bi}"
            p = f"{layer}.{bi}"
            y = _conv_bn(g, x, scope, f"{p}.conv1", cin, w, 1)
            y = _conv_bn(g, y, scope, f"{p}.conv2", w, w, 3, stride=stride, group=groups)
            y = _conv_bn(g, y, scope, f"{p}.conv3", w, w, 3, group=w)  # depthwise
            y = _conv_bn(g, y, scope, f"{p}.conv4", w, w, 1, relu=False)
            if stride != 1 or cin != w:
                sc = _conv_bn(g, x, f"{scope}/downsample", f"{p}.downsample.0", cin, w, 1, stride=stride,
                              relu=False)
            else:
                sc = x
            y = g.node("Add", [y, sc], scope)
            x = g.node("Relu", [y], f"{scope}/relu_out")
            cin = w
    x = g.node("GlobalAveragePool", [x], "/avgpool")
    x = g.node("Flatten", [x], "", axis=1)
    fw = g.randn("fc.weight", (num_classes, cin), 1.0 / math.sqrt(cin))
    fb = g.randn("fc.bias", (num_classes,), 0.1)
    x = g.node("Gemm", [x, fw, fb], "/fc", alpha=1.0, beta=1.0, transB=1)
    g.output("output", x, _F, [_batch_dim(batch, dynamic_batch), num_classes])
    return g.model("main_graph")


# ------------------------------------------------------------------------------------------------
# (b) transformer encoder


def _linear(g: ModelGraph, x: str, scope: str, pname: str, din: int, dout: int) -> str:
    """``nn.Linear`` on a 3-D input as exported: MatMul with a transposed weight, then Add(bias, .)."""
    w = g.randn(g.onnx_name("MatMul"), (din, dout), 1.0 / math.sqrt(din))
    b = g.randn(f"{pname}.bias", (dout,), 0.02)
    y = g.node("MatMul", [x, w], scope)
    return g.node("Add", [b, y], scope)


def _layer_norm(g: ModelGraph, x: str, scope: str, pname: str, d: int, eps: float) -> str:
    gamma = g.init(f"{pname}.weight", g.rng.uniform(0.8, 1.2, d).astype(np.float32))
    beta = g.init(f"{pname}.bias", (g.rng.standard_normal(d) * 0.02).astype(np.float32))
    return g.node("LayerNormalization", [x, gamma, beta], scope, axis=-1, epsilon=eps)


def _batch_seq(g: ModelGraph, x: str, scope: str) -> tuple[str, str]:
    """Shape(x) -> Gather(0), Gather(1) -> Unsqueeze: the exporter's dynamic ``x.size(0), x.size(1)``."""
    shp = g.node("Shape", [x], scope)
    b = g.node("Gather", [shp, g.const(0, scope)], scope, axis=0)
    s = g.node("Gather", [shp, g.const(1, scope)], scope, axis=0)
    bu = g.node("Unsqueeze", [b, g.const([0], scope)], scope)
    su = g.node("Unsqueeze", [s, g.const([0], scope)], scope)
    return bu, su


def build_transformer(batch: int = 1, seq_len: int = 16, vocab_size: int = 100, d_model: int = 32,
                      num_heads: int = 4, num_layers: int = 2, d_ff: Optional[int] = None,
                      max_positions: int = 64, type_vocab_size: int = 2, seed: int = 0,
                      dynamic_batch: bool = False) -> onnx.ModelProto:
    """A BERT-style encoder: inputs ``input_ids`` and ``attention_mask`` (int64 [batch, seq_len]),
    outputs ``last_hidden_state`` [batch, seq_len, d_model] and ``pooler_output`` [batch, d_model].

    Even layers use a fused QKV projection with Split and Div scaling; odd layers separate Q/K/V
    projections and Mul scaling. Weights: about ``4 * (vocab_size * d_model + num_layers *
    (4 + 2 * d_ff / d_model) * d_model**2)`` bytes.
    """
    if d_model % num_heads:
        raise ValueError("d_model must be a multiple of num_heads")
    if seq_len > max_positions:
        raise ValueError("seq_len must be <= max_positions")
    d_ff = d_ff or 4 * d_model
    dh = d_model // num_heads
    g = ModelGraph(seed)
    bdim = _batch_dim(batch, dynamic_batch)
    ids = g.input("input_ids", _I64, [bdim, seq_len])
    mask = g.input("attention_mask", _I64, [bdim, seq_len])

    # ---- embeddings
    sc = "/embeddings"
    word = g.randn("embeddings.word_embeddings.weight", (vocab_size, d_model), 0.5)
    pos_w = g.randn("embeddings.position_embeddings.weight", (max_positions, d_model), 0.5)
    typ_w = g.randn("embeddings.token_type_embeddings.weight", (type_vocab_size, d_model), 0.5)
    pos_ids = g.init("embeddings.position_ids", np.arange(max_positions, dtype=np.int64)[None, :])
    typ_ids = g.init("embeddings.token_type_ids", np.zeros((1, max_positions), dtype=np.int64))
    shp = g.node("Shape", [ids], sc)
    s = g.node("Gather", [shp, g.const(1, sc)], sc, axis=0)
    su = g.node("Unsqueeze", [s, g.const([0], sc)], sc)
    zero, one, ax1 = g.const([0], sc), g.const([1], sc), g.const([1], sc)
    pos = g.node("Slice", [pos_ids, zero, su, ax1, one], sc)
    typ = g.node("Slice", [typ_ids, zero, su, ax1, one], sc)
    typ = g.node("Expand", [typ, shp], sc)
    e = g.node("Gather", [word, ids], f"{sc}/word_embeddings")
    t = g.node("Gather", [typ_w, typ], f"{sc}/token_type_embeddings")
    e = g.node("Add", [e, t], sc)
    p = g.node("Gather", [pos_w, pos], f"{sc}/position_embeddings")
    e = g.node("Add", [e, p], sc)
    e = _layer_norm(g, e, f"{sc}/LayerNorm", "embeddings.LayerNorm", d_model, 1e-12)
    x = g.node("Identity", [e], f"{sc}/dropout")  # what an exported Dropout may leave behind

    # ---- mask: (attention_mask == 0)[:, None, None, :], used by masked_fill (Where)
    m = g.node("Unsqueeze", [mask, g.const([1, 2])], "")
    masked = g.node("Equal", [m, g.const(0)], "")

    # ---- encoder layers
    for li in range(num_layers):
        scope = f"/encoder/layer.{li}"
        pn = f"encoder.layer.{li}"
        att = f"{scope}/attention/self"
        if li % 2 == 0:
            qkv = _linear(g, x, f"{att}/qkv", f"{pn}.attention.self.qkv", d_model, 3 * d_model)
            q, k, v = g.node("Split", [qkv, g.const([d_model] * 3, att)], att, n_out=3, axis=-1)
        else:
            q = _linear(g, x, f"{att}/query", f"{pn}.attention.self.query", d_model, d_model)
            k = _linear(g, x, f"{att}/key", f"{pn}.attention.self.key", d_model, d_model)
            v = _linear(g, x, f"{att}/value", f"{pn}.attention.self.value", d_model, d_model)
        heads = []
        for val, perm in ((q, [0, 2, 1, 3]), (k, [0, 2, 3, 1]), (v, [0, 2, 1, 3])):
            bu, su = _batch_seq(g, val, att)
            new_shape = g.node("Concat", [bu, su, g.const([num_heads], att), g.const([dh], att)], att, axis=0)
            r = g.node("Reshape", [val, new_shape], att, allowzero=0)
            heads.append(g.node("Transpose", [r], att, perm=perm))
        qh, kt, vh = heads
        scores = g.node("MatMul", [qh, kt], att)
        if li % 2 == 0:
            scores = g.node("Div", [scores, g.const(math.sqrt(dh), att)], att)
        else:
            scores = g.node("Mul", [scores, g.const(1.0 / math.sqrt(dh), att)], att)
        scores = g.node("Where", [masked, g.const(_FMIN, att), scores], att)
        probs = g.node("Softmax", [scores], att, axis=-1)
        ctx = g.node("MatMul", [probs, vh], att)
        ctx = g.node("Transpose", [ctx], att, perm=[0, 2, 1, 3])
        bu, su = _batch_seq(g, ctx, att)
        ctx = g.node("Reshape", [ctx, g.node("Concat", [bu, su, g.const([d_model], att)], att, axis=0)], att,
                     allowzero=0)
        o = _linear(g, ctx, f"{scope}/attention/output/dense", f"{pn}.attention.output.dense", d_model, d_model)
        o = g.node("Add", [o, x], f"{scope}/attention/output")
        x = _layer_norm(g, o, f"{scope}/attention/output/LayerNorm", f"{pn}.attention.output.LayerNorm",
                        d_model, 1e-12)
        h = _linear(g, x, f"{scope}/intermediate/dense", f"{pn}.intermediate.dense", d_model, d_ff)
        # GELU (erf form): x * 0.5 * (1 + erf(x / sqrt(2))), as exported from nn.GELU()
        act = f"{scope}/intermediate/intermediate_act_fn"
        e1 = g.node("Div", [h, g.const(1.4142135381698608, act)], act)
        e1 = g.node("Erf", [e1], act)
        e1 = g.node("Add", [e1, g.const(1.0, act)], act)
        e1 = g.node("Mul", [h, e1], act)
        h = g.node("Mul", [e1, g.const(0.5, act)], act)
        o = _linear(g, h, f"{scope}/output/dense", f"{pn}.output.dense", d_ff, d_model)
        o = g.node("Add", [o, x], f"{scope}/output")
        x = _layer_norm(g, o, f"{scope}/output/LayerNorm", f"{pn}.output.LayerNorm", d_model, 1e-12)

    # ---- outputs: the hidden states through an Identity, and a pooler (Gather, Gemm, Tanh, Clip)
    last = g.node("Identity", [x], "")
    first = g.node("Gather", [x, g.const(0, "/pooler")], "/pooler", axis=1)
    pw = g.randn("pooler.dense.weight", (d_model, d_model), 1.0 / math.sqrt(d_model))
    pb = g.randn("pooler.dense.bias", (d_model,), 0.02)
    pooled = g.node("Gemm", [first, pw, pb], "/pooler/dense", alpha=1.0, beta=1.0, transB=1)
    pooled = g.node("Tanh", [pooled], "/pooler/activation")
    pooled = g.node("Clip", [pooled, g.const(-0.95, "/pooler"), g.const(0.95, "/pooler")], "/pooler")
    g.output("last_hidden_state", last, _F, [bdim, seq_len, d_model])
    g.output("pooler_output", pooled, _F, [bdim, d_model])
    return g.model("main_graph")


# ------------------------------------------------------------------------------------------------
# (c) Inception-like blocks


def _conv_relu(g: ModelGraph, x: str, scope: str, pname: str, cin: int, cout: int, k: int, stride: int = 1,
               same: bool = False) -> str:
    w = g.randn(f"{pname}.weight", (cout, cin, k, k), math.sqrt(2.0 / (cin * k * k)))
    b = g.randn(f"{pname}.bias", (cout,), 0.05)
    pad = dict(auto_pad="SAME_UPPER") if same else dict(pads=[k // 2] * 4)
    y = g.node("Conv", [x, w, b], scope, kernel_shape=[k, k], strides=[stride, stride], **pad)
    return g.node("Relu", [y], scope)


def build_inception(batch: int = 1, image_size: int | tuple[int, int] = 17, in_channels: int = 3,
                    stem_channels: int = 16, branch_channels: Sequence[int] = (8, 12, 8, 8), blocks: int = 2,
                    num_classes: int = 10, seed: int = 0, dynamic_batch: bool = False) -> onnx.ModelProto:
    """Inception-like blocks on an odd-sized image.

    stem: Conv3x3/2 SAME_UPPER + Relu; per block: four branches (1x1; 1x1 -> 3x3 SAME_UPPER;
    1x1 -> 5x5 SAME_UPPER; AveragePool 3x3 pad 1 count_include_pad=1 -> 1x1) joined by Concat on
    channels; after every block but the last a reduction MaxPool 3x3/2 SAME_UPPER, and after the first
    an AveragePool 2x2/2 SAME_UPPER (count_include_pad=0); head: GlobalAveragePool, Flatten, Gemm.
    """
    g = ModelGraph(seed)
    hw = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    bdim = _batch_dim(batch, dynamic_batch)
    x = g.input("input", _F, [bdim, in_channels, hw[0], hw[1]])
    x = _conv_relu(g, x, "/stem/conv", "stem.conv", in_channels, stem_channels, 3, stride=2, same=True)
    cin = stem_channels
    c1, c3, c5, cp = branch_channels
    for bi in range(blocks):
        sc, pn = f"/blocks/blocks.{bi}", f"blocks.{bi}"
        b1 = _conv_relu(g, x, f"{sc}/branch1x1/conv", f"{pn}.branch1x1.conv", cin, c1, 1)
        b2 = _conv_relu(g, x, f"{sc}/branch3x3_1/conv", f"{pn}.branch3x3_1.conv", cin, c3 // 2 or 1, 1)
        b2 = _conv_relu(g, b2, f"{sc}/branch3x3_2/conv", f"{pn}.branch3x3_2.conv", c3 // 2 or 1, c3, 3, same=True)
        b3 = _conv_relu(g, x, f"{sc}/branch5x5_1/conv", f"{pn}.branch5x5_1.conv", cin, c5 // 2 or 1, 1)
        b3 = _conv_relu(g, b3, f"{sc}/branch5x5_2/conv", f"{pn}.branch5x5_2.conv", c5 // 2 or 1, c5, 5, same=True)
        b4 = g.node("AveragePool", [x], f"{sc}/branch_pool", kernel_shape=[3, 3], strides=[1, 1],
                    pads=[1, 1, 1, 1], count_include_pad=1, ceil_mode=0)
        b4 = _conv_relu(g, b4, f"{sc}/branch_pool/conv", f"{pn}.branch_pool.conv", cin, cp, 1)
        x = g.node("Concat", [b1, b2, b3, b4], sc, axis=1)
        cin = c1 + c3 + c5 + cp
        if bi + 1 < blocks:
            x = g.node("MaxPool", [x], f"{sc}/reduce", kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER")
            if bi == 0:
                x = g.node("AveragePool", [x], f"{sc}/reduce", kernel_shape=[2, 2], strides=[2, 2],
                           auto_pad="SAME_UPPER", count_include_pad=0)
    x = g.node("GlobalAveragePool", [x], "/avgpool")
    x = g.node("Flatten", [x], "", axis=1)
    fw = g.randn("fc.weight", (num_classes, cin), 1.0 / math.sqrt(cin))
    fb = g.randn("fc.bias", (num_classes,), 0.1)
    x = g.node("Gemm", [x, fw, fb], "/fc", alpha=1.0, beta=1.0, transB=1)
    g.output("output", x, _F, [bdim, num_classes])
    return g.model("main_graph")


BUILDERS = {"cnn": build_cnn, "transformer": build_transformer, "inception": build_inception}


# ------------------------------------------------------------------------------------------------
# helpers


def weight_bytes(model: onnx.ModelProto) -> int:
    """Total bytes of the model's initializers."""
    total = 0
    for t in model.graph.initializer:
        total += numpy_helper.to_array(t).nbytes if not t.raw_data else len(t.raw_data)
    return total


def random_inputs(model: onnx.ModelProto, seed: int = 0, shapes: Optional[dict] = None) -> dict[str, np.ndarray]:
    """Random feeds for the model's graph inputs (``shapes`` fixes symbolic dimensions).

    Float inputs are standard normal. An integer input that indexes an initializer through Gather
    (embedding ids) takes values in ``[0, rows)``; other integer inputs (masks) are 0/1 with the
    first position set.
    """
    rng = np.random.default_rng(seed)
    inits = {t.name: t for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        if shapes and vi.name in shapes:
            shape = list(shapes[vi.name])
        else:
            shape = []
            for d in tt.shape.dim:
                if not d.HasField("dim_value"):
                    raise ValueError(f"input '{vi.name}' has a symbolic dimension; pass shapes=")
                shape.append(d.dim_value)
        dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if np.issubdtype(dtype, np.floating):
            feeds[vi.name] = rng.standard_normal(shape).astype(dtype)
            continue
        rows = [inits[n.input[0]].dims[0] for n in model.graph.node
                if n.op_type == "Gather" and len(n.input) == 2 and n.input[1] == vi.name and n.input[0] in inits]
        if rows:
            feeds[vi.name] = rng.integers(0, min(rows), size=shape).astype(dtype)
        else:
            arr = rng.integers(0, 2, size=shape).astype(dtype)
            if arr.ndim:
                arr[..., 0] = 1
            feeds[vi.name] = arr
    return feeds


def example_cnn() -> onnx.ModelProto:
    """The bundled example: a small CNN (1x3x32x32 -> 10 classes), a few hundred KB of weights."""
    return build_cnn(batch=1, image_size=32, widths=(16, 32, 64), blocks=(1, 2, 1), groups=4, seed=0)


def write_example_models(directory: str = MODELS_DIR) -> list[str]:
    """(Re)write the bundled example model file(s); returns their paths."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, os.path.basename(EXAMPLE_CNN))
    model = example_cnn()
    onnx.checker.check_model(model, full_check=True)
    data = model.SerializeToString()
    if len(data) >= 2 * 1024 * 1024:
        raise RuntimeError(f"example model is {len(data)} bytes, keep it under 2 MB")
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return [path]


if __name__ == "__main__":
    for p in write_example_models():
        print(p, os.path.getsize(p), "bytes")
