"""Standard CNN and transformer-encoder definitions in ``torch.nn``, exported by PyTorch's ONNX exporter.

These are the "real exported models" of the round-trip tests (``test/unit/test_torch_exported.py``) and
of the round-trip measurements (``python -m taso_mlir.benchmarks.torch_models --measure``). The
definitions follow the papers' layouts (written here, not copied from torchvision):

- ``resnet18`` / ``resnet50``: ResNet (He et al. 2015) with basic / bottleneck blocks, the stride on the
  3x3 convolution (the "v1.5" layout torchvision uses), a 1x1 strided projection shortcut, 7x7 stem,
  3x3 max pool, global average pool and a 1000-way linear classifier. ResNet-50 has ~100 MB of weights.
- ``mobilenet_v2``: MobileNetV2 (Sandler et al. 2018): inverted residuals (1x1 expand, 3x3 depthwise,
  1x1 linear projection) with ReLU6, width multiplier 1.0.
- ``resnext26``: ResNeXt (Xie et al. 2017) bottlenecks with 32-group 3x3 convolutions (32x4d), stages
  of [2, 2, 2, 2] blocks.
- ``bert_mini`` / ``bert_base`` / ``bert_600mb``: a BERT encoder (Devlin et al. 2018): word, position and
  token-type embeddings with LayerNorm, post-norm layers of multi-head self-attention with an additive
  padding mask (from an ``attention_mask`` input) and an exact (erf) GELU feed-forward, and a tanh
  pooler. ``bert_base`` is BERT-base (12 layers, hidden 768, 110 M parameters, ~440 MB);
  ``bert_600mb`` is a BERT-large-width encoder (hidden 1024, 16 heads, 12 layers, FFN 3840, 4,096-word
  vocabulary) with ~600 MB of weights that stays under 600 nodes.
- ``nn_transformer``: ``torch.nn.TransformerEncoder`` itself (6 layers, d_model 512, GELU, batch-first)
  with a ``src_key_padding_mask``, in front of a token embedding and behind a classifier head.

Every parameter and BatchNorm running statistic is random (a fixed seed): the models are untrained.
Inputs are batch 1 images of 3x224x224 for the CNNs and batch 2 sequences of 128 tokens for the
encoders. ``export(name, path)`` writes opset 17 with PyTorch's ONNX exporter: the TorchScript
exporter (``dynamo=False``, the default here) or the ``torch.export``-based one (``exporter="dynamo"``,
needs ``onnxscript``). ``example_inputs(name)`` gives numpy inputs that the exported model accepts.

torch is imported lazily: this module imports (and lists its models) without torch installed.

    python -m taso_mlir.benchmarks.torch_models resnet50 out.onnx [--exporter dynamo]
    python -m taso_mlir.benchmarks.torch_models --measure [MODEL ...]   # the round-trip table
    python -m taso_mlir.benchmarks.torch_models --search [MODEL ...]    # taso-search on them: costs, CPU latency
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

OPSET = 17
SEED = 0
IMAGE = (1, 3, 224, 224)
BATCH, SEQ = 2, 128
TORCH_VERSION = "2.13.0"  # what the round trips were measured with (`pip install torch==2.13.0`)


@dataclass(frozen=True)
class ModelInfo:
    name: str
    kind: str  # "cnn" or "encoder"
    big: bool  # only run with TASO_BIG_MODELS=1
    build: Callable[[], object]
    vocab: int = 0


def _torch():
    try:
        import torch
    except ImportError:
        raise ImportError("torch not installed: pip install torch==2.13.0 to export the models") from None
    return torch


# --------------------------------------------------------------------------------------------
# CNNs


def _cnn_classes():
    torch = _torch()
    nn = torch.nn

    def conv_bn(cin, cout, k, stride=1, groups=1):
        return [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]

    class Residual(nn.Module):
        """relu(branch(x) + shortcut(x)); the shortcut is a strided 1x1 conv+BN when shapes change."""

        def _residual_init(self, cin, cout, stride):
            self.relu = nn.ReLU(inplace=True)
            self.shortcut = None
            if stride != 1 or cin != cout:
                self.shortcut = nn.Sequential(*conv_bn(cin, cout, 1, stride))

        def _join(self, y, x):
            s = x if self.shortcut is None else self.shortcut(x)
            return self.relu(y + s)

    class Basic(Residual):
        expansion = 1

        def __init__(self, cin, width, stride, groups=1, base_width=64):
            super().__init__()
            cout = width
            self.conv1, self.bn1 = conv_bn(cin, width, 3, stride)
            self.conv2, self.bn2 = conv_bn(width, cout, 3)
            self._residual_init(cin, cout, stride)

        def forward(self, x):
            y = self.relu(self.bn1(self.conv1(x)))
            return self._join(self.bn2(self.conv2(y)), x)

    class Bottleneck(Residual):
        expansion = 4

        def __init__(self, cin, width, stride, groups=1, base_width=64):
            super().__init__()
            inner = int(width * base_width / 64) * groups  # ResNeXt: C x d channels in the grouped conv
            cout = width * self.expansion
            self.conv1, self.bn1 = conv_bn(cin, inner, 1)
            self.conv2, self.bn2 = conv_bn(inner, inner, 3, stride, groups)
            self.conv3, self.bn3 = conv_bn(inner, cout, 1)
            self._residual_init(cin, cout, stride)

        def forward(self, x):
            y = self.relu(self.bn1(self.conv1(x)))
            y = self.relu(self.bn2(self.conv2(y)))
            return self._join(self.bn3(self.conv3(y)), x)

    class ResNet(nn.Module):
        def __init__(self, block, layers, groups=1, base_width=64, classes=1000):
            super().__init__()
            self.stem = nn.Sequential(*conv_bn(3, 64, 7, 2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1))
            stages, cin = [], 64
            for i, n in enumerate(layers):
                width = 64 * 2**i
                blocks = []
                for j in range(n):
                    blocks.append(block(cin, width, 2 if (j == 0 and i > 0) else 1, groups, base_width))
                    cin = width * block.expansion
                stages.append(nn.Sequential(*blocks))
            self.stages = nn.Sequential(*stages)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(cin, classes)

        def forward(self, x):
            x = self.stages(self.stem(x))
            return self.fc(torch.flatten(self.pool(x), 1))

    class InvertedResidual(nn.Module):
        def __init__(self, cin, cout, stride, expand):
            super().__init__()
            hidden = cin * expand
            layers = []
            if expand != 1:
                layers += [*conv_bn(cin, hidden, 1), nn.ReLU6(inplace=True)]
            layers += [*conv_bn(hidden, hidden, 3, stride, groups=hidden), nn.ReLU6(inplace=True)]
            layers += conv_bn(hidden, cout, 1)  # linear bottleneck: no activation
            self.body = nn.Sequential(*layers)
            self.residual = stride == 1 and cin == cout

        def forward(self, x):
            y = self.body(x)
            return x + y if self.residual else y

    class MobileNetV2(nn.Module):
        # (expansion t, channels c, repeats n, first stride s), Table 2 of the paper
        CONFIG = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                  (6, 160, 3, 2), (6, 320, 1, 1)]

        def __init__(self, classes=1000):
            super().__init__()
            layers = [*conv_bn(3, 32, 3, 2), nn.ReLU6(inplace=True)]
            cin = 32
            for t, c, n, s in self.CONFIG:
                for j in range(n):
                    layers.append(InvertedResidual(cin, c, s if j == 0 else 1, t))
                    cin = c
            layers += [*conv_bn(cin, 1280, 1), nn.ReLU6(inplace=True)]
            self.features = nn.Sequential(*layers)
            self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, classes))

        def forward(self, x):
            x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
            return self.classifier(torch.flatten(x, 1))

    return Basic, Bottleneck, ResNet, MobileNetV2


def _resnet18():
    Basic, _, ResNet, _ = _cnn_classes()
    return ResNet(Basic, [2, 2, 2, 2])


def _resnet50():
    _, Bottleneck, ResNet, _ = _cnn_classes()
    return ResNet(Bottleneck, [3, 4, 6, 3])


def _resnext26():
    _, Bottleneck, ResNet, _ = _cnn_classes()
    return ResNet(Bottleneck, [2, 2, 2, 2], groups=32, base_width=4)


def _mobilenet_v2():
    *_, MobileNetV2 = _cnn_classes()
    return MobileNetV2()


# --------------------------------------------------------------------------------------------
# transformer encoders


def _bert(vocab, hidden, layers, heads, ffn, max_pos=512, type_vocab=2):
    torch = _torch()
    nn = torch.nn

    class SelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.heads, self.head_dim = heads, hidden // heads
            self.query, self.key, self.value = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden), \
                nn.Linear(hidden, hidden)
            self.out = nn.Linear(hidden, hidden)
            self.norm = nn.LayerNorm(hidden, eps=1e-12)
            self.drop = nn.Dropout(0.1)

        def split_heads(self, x):  # [B, S, H] -> [B, heads, S, head_dim]
            b, s, _ = x.shape
            return x.view(b, s, self.heads, self.head_dim).permute(0, 2, 1, 3)

        def forward(self, x, mask):
            q, k, v = self.split_heads(self.query(x)), self.split_heads(self.key(x)), self.split_heads(self.value(x))
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim) + mask
            ctx = torch.matmul(self.drop(torch.softmax(scores, dim=-1)), v)
            b, _, s, _ = ctx.shape
            ctx = ctx.permute(0, 2, 1, 3).reshape(b, s, hidden)
            return self.norm(x + self.drop(self.out(ctx)))

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention = SelfAttention()
            self.intermediate = nn.Linear(hidden, ffn)
            self.act = nn.GELU()  # exact (erf) GELU, as in BERT
            self.output = nn.Linear(ffn, hidden)
            self.norm = nn.LayerNorm(hidden, eps=1e-12)
            self.drop = nn.Dropout(0.1)

        def forward(self, x, mask):
            x = self.attention(x, mask)
            return self.norm(x + self.drop(self.output(self.act(self.intermediate(x)))))

    class Bert(nn.Module):
        def __init__(self):
            super().__init__()
            self.word = nn.Embedding(vocab, hidden)
            self.position = nn.Embedding(max_pos, hidden)
            self.token_type = nn.Embedding(type_vocab, hidden)
            self.norm = nn.LayerNorm(hidden, eps=1e-12)
            self.drop = nn.Dropout(0.1)
            self.layers = nn.ModuleList(Layer() for _ in range(layers))
            self.pooler = nn.Linear(hidden, hidden)
            self.register_buffer("position_ids", torch.arange(max_pos).unsqueeze(0), persistent=False)

        def forward(self, input_ids, token_type_ids, attention_mask):
            seq = input_ids.shape[1]
            pos = self.position_ids[:, :seq]
            x = self.word(input_ids) + self.position(pos) + self.token_type(token_type_ids)
            x = self.drop(self.norm(x))
            # [B, S] of 1 (attend) / 0 (padding) -> an additive [B, 1, 1, S] mask
            mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -10000.0
            for layer in self.layers:
                x = layer(x, mask)
            pooled = torch.tanh(self.pooler(x[:, 0]))
            return x, pooled

    return Bert()


def _nn_transformer():
    torch = _torch()
    nn = torch.nn
    vocab, d = 8192, 512

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, d)
            self.pos = nn.Parameter(torch.randn(1, SEQ, d) * 0.02)
            layer = nn.TransformerEncoderLayer(d, 8, 2048, dropout=0.1, activation="gelu", batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, 5, enable_nested_tensor=False)
            self.head = nn.Linear(d, 10)

        def forward(self, input_ids, attention_mask):
            x = self.embed(input_ids) + self.pos
            x = self.encoder(x, src_key_padding_mask=attention_mask == 0)
            return self.head(x.mean(dim=1))

    return Encoder()


MODELS: dict[str, ModelInfo] = {m.name: m for m in [
    ModelInfo("resnet18", "cnn", False, _resnet18),
    ModelInfo("mobilenet_v2", "cnn", False, _mobilenet_v2),
    ModelInfo("resnext26", "cnn", False, _resnext26),
    ModelInfo("resnet50", "cnn", False, _resnet50),
    ModelInfo("bert_mini", "encoder", False, lambda: _bert(8192, 256, 4, 4, 1024), vocab=8192),
    ModelInfo("nn_transformer", "encoder", False, _nn_transformer, vocab=8192),
    ModelInfo("bert_base", "encoder", True, lambda: _bert(30522, 768, 12, 12, 3072), vocab=30522),
    ModelInfo("bert_600mb", "encoder", True, lambda: _bert(3072, 1024, 12, 16, 3840), vocab=3072),
]}


def _randomize(model, seed: int) -> None:
    """Random weights everywhere: parameters keep torch's default (seeded) initialization; BatchNorm's
    affine parameters and running statistics, which torch initializes to constants, are drawn too."""
    torch = _torch()
    g = torch.Generator().manual_seed(seed + 1)
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            with torch.no_grad():
                m.weight.uniform_(0.5, 1.5, generator=g)
                m.bias.normal_(0.0, 0.1, generator=g)
                m.running_mean.normal_(0.0, 0.1, generator=g)
                m.running_var.uniform_(0.5, 1.5, generator=g)


def build(name: str):
    """The eval-mode torch module of ``name`` with its random weights (seeded)."""
    torch = _torch()
    if name not in MODELS:
        raise KeyError(f"unknown model '{name}' (known: {', '.join(MODELS)})")
    torch.manual_seed(SEED)
    model = MODELS[name].build()
    _randomize(model, SEED)
    return model.eval()


def input_names(name: str) -> list[str]:
    info = MODELS[name]
    if info.kind == "cnn":
        return ["image"]
    if name == "nn_transformer":
        return ["input_ids", "attention_mask"]
    return ["input_ids", "token_type_ids", "attention_mask"]


def output_names(name: str) -> list[str]:
    if name.startswith("bert"):
        return ["last_hidden_state", "pooled"]
    return ["logits"]


def example_inputs(name: str, seed: int = 1) -> dict[str, np.ndarray]:
    """Random inputs the model accepts: images ~ N(0, 1); token ids in the vocabulary, and attention
    masks whose second sequence is padded after 3/4 of its length."""
    info = MODELS[name]
    rng = np.random.default_rng(seed)
    if info.kind == "cnn":
        return {"image": rng.standard_normal(IMAGE).astype(np.float32)}
    ids = rng.integers(0, info.vocab, (BATCH, SEQ)).astype(np.int64)
    mask = np.ones((BATCH, SEQ), np.int64)
    mask[1, SEQ * 3 // 4:] = 0
    feeds = {"input_ids": ids, "attention_mask": mask}
    if "token_type_ids" in input_names(name):
        tt = np.zeros((BATCH, SEQ), np.int64)
        tt[:, SEQ // 2:] = 1
        feeds["token_type_ids"] = tt
    return {k: feeds[k] for k in input_names(name)}


def export(name: str, path: str, exporter: str = "torchscript") -> str:
    """Export model ``name`` to ``path`` (opset 17, static shapes, random weights from a fixed seed) with
    PyTorch's ONNX exporter: ``"torchscript"`` (``torch.onnx.export(..., dynamo=False)``) or ``"dynamo"``
    (``dynamo=True``; needs onnxscript). Returns ``path``."""
    torch = _torch()
    model = build(name)
    args = tuple(torch.from_numpy(v) for v in example_inputs(name).values())
    kw = dict(input_names=input_names(name), output_names=output_names(name), opset_version=OPSET)
    fastpath = torch.backends.mha.get_fastpath_enabled()
    # nn.TransformerEncoderLayer's eval-mode fast path (one fused aten op) has no ONNX export
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        _export(torch, model, args, path, exporter, kw)
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)
    return path


def _export(torch, model, args, path, exporter, kw) -> None:
    import warnings

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            torch.onnx.export(model, args, path, dynamo=False, do_constant_folding=True, **kw)
        elif exporter == "dynamo":
            import contextlib
            import io
            import logging

            logging.getLogger("torch.onnx").setLevel(logging.ERROR)
            with contextlib.redirect_stdout(io.StringIO()):
                prog = torch.onnx.export(model, args, dynamo=True, external_data=False, **kw)
                prog.save(path)
        else:
            raise ValueError(f"unknown exporter '{exporter}' (torchscript or dynamo)")


def exporter_versions() -> dict[str, str]:
    out = {"torch": _torch().__version__}
    try:
        import onnxscript

        out["onnxscript"] = onnxscript.__version__
    except ImportError:
        pass
    return out


# --------------------------------------------------------------------------------------------
# round trips and their measurements (no torch needed)

# The child reports its own peak RSS: VmHWM (ru_maxrss would include the parent's RSS at fork time,
# which survives exec on Linux).
_CHILD = """
import resource, sys
from taso_mlir.tools.taso_opt import main
rc = main(sys.argv[1:])
try:
    kb = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
except (OSError, StopIteration):
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
sys.stderr.write("\\ntaso-roundtrip-peak-rss-kb %d\\n" % kb)
sys.exit(rc)
"""


@dataclass
class RoundTrip:
    rc: int
    wall_s: float  # the whole `taso-opt in.onnx -o out.onnx` process: start-up, import, export, write
    peak_rss_mb: float  # that process's peak resident set size
    stderr: str


def roundtrip(in_path: str, out_path: str, *extra: str, timeout: float = 1800) -> RoundTrip:
    """``taso-opt in_path -o out_path [extra]`` in a fresh process, timed, with its peak RSS."""
    import re
    import subprocess
    import time

    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", _CHILD, in_path, "-o", out_path, *extra],
                       capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t
    m = re.search(r"taso-roundtrip-peak-rss-kb (\d+)", p.stderr)
    err = re.sub(r"\s*taso-roundtrip-peak-rss-kb \d+\s*", "", p.stderr)
    return RoundTrip(p.returncode, wall, int(m.group(1)) / 1024 if m else float("nan"), err)


def model_stats(path: str) -> dict:
    """Node count and weight megabytes (initializers and Constant nodes) of an ONNX file."""
    import onnx

    m = onnx.load(path, load_external_data=False)
    nbytes = sum(len(t.raw_data) or onnx.numpy_helper.to_array(t).nbytes for t in m.graph.initializer)
    for n in m.graph.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    nbytes += len(a.t.raw_data) or onnx.numpy_helper.to_array(a.t).nbytes
    return dict(nodes=len(m.graph.node), weight_mb=nbytes / 1e6, file_mb=os.path.getsize(path) / 1e6,
                opset=next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), 0))


def compare_outputs(a_path: str, b_path: str, feeds_list: list[dict]) -> tuple[float, float]:
    """Both models in onnxruntime on each feed: (largest |a - b|, max(1, largest |a|)) over all outputs."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    max_abs, scale = 0.0, 1.0
    sa = ort.InferenceSession(a_path, opts, providers=["CPUExecutionProvider"])
    ra = [sa.run(None, f) for f in feeds_list]
    del sa
    sb = ort.InferenceSession(b_path, opts, providers=["CPUExecutionProvider"])
    rb = [sb.run(None, f) for f in feeds_list]
    del sb
    for xs, ys in zip(ra, rb):
        assert len(xs) == len(ys)
        for x, y in zip(xs, ys):
            assert x.shape == y.shape and x.dtype == y.dtype, (x.shape, x.dtype, y.shape, y.dtype)
            assert np.isfinite(x).all(), "the original model gives non-finite outputs"
            max_abs = max(max_abs, float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64)))))
            scale = max(scale, float(np.max(np.abs(x))))
    return max_abs, scale


def feeds_for(name: str) -> list[dict]:
    """Two input sets: ``example_inputs`` (seed 1) and another draw (seed 2)."""
    return [example_inputs(name, seed=1), example_inputs(name, seed=2)]


def measure(names: list[str], exporter: str, workdir: str, keep: bool = False) -> list[dict]:
    """Export, round-trip (timed, peak RSS), check and compare each model; one row per model."""
    import time

    import onnx

    rows = []
    for name in names:
        src = os.path.join(workdir, f"{name}.{exporter}.onnx")
        dst = os.path.join(workdir, f"{name}.{exporter}.taso.onnx")
        t = time.perf_counter()
        export(name, src, exporter)
        row = dict(model=name, exporter=exporter, export_s=time.perf_counter() - t, **model_stats(src))
        rt = roundtrip(src, dst)
        row.update(rc=rt.rc, wall_s=rt.wall_s, peak_rss_mb=rt.peak_rss_mb)
        if rt.rc != 0:
            row["error"] = rt.stderr.strip().splitlines()[-1] if rt.stderr.strip() else f"exit {rt.rc}"
        else:
            onnx.checker.check_model(dst, full_check=True)
            row["nodes_out"] = model_stats(dst)["nodes"]
            row["max_abs"], row["scale"] = compare_outputs(src, dst, feeds_for(name))
            row["ok"] = row["max_abs"] <= 1e-5 * row["scale"]
        rows.append(row)
        print(_format_row(row), flush=True)
        if not keep:
            for p in (src, dst, dst + ".data"):
                if os.path.exists(p):
                    os.remove(p)
    return rows


def measure_search(names: list[str], exporter: str, workdir: str) -> list[dict]:
    """Export each model and optimize it twice with ``taso-search`` (the analytic T4 cost model, and
    ``cost-model=cpu``), each in a fresh ``taso-opt`` process with its numeric check; then compare
    each result with the export on two input sets and time both against it in onnxruntime on this
    machine's CPU (``latency.compare``: interleaved rounds, the median of the per-round speedups and
    their quartiles). One row per model."""
    import json

    import onnx

    from taso_mlir.passes.cost.latency import compare

    rows = []
    for name in names:
        src = os.path.join(workdir, f"{name}.{exporter}.onnx")
        export(name, src, exporter)
        row = dict(model=name, exporter=exporter, **model_stats(src))
        for tag in ("t4", "cpu"):
            dst, rep = os.path.join(workdir, f"{name}.{tag}.onnx"), os.path.join(workdir, f"{name}.{tag}.json")
            model = "analytic:t4" if tag == "t4" else "cpu"
            rt = roundtrip(src, dst, f"--pass-pipeline=builtin.module(taso-search{{cost-model={model} report={rep}}})")
            if rt.rc != 0:
                row[tag] = dict(error=rt.stderr.strip().splitlines()[-1] if rt.stderr.strip() else f"exit {rt.rc}")
                continue
            fr = json.load(open(rep))["functions"][0]
            max_abs, scale = compare_outputs(src, dst, feeds_for(name))
            lat = compare(onnx.load(src), onnx.load(dst))
            row[tag] = dict(before=fr["cost_prepared_ms"], imported=fr["cost_before_ms"], after=fr["cost_after_ms"], search_s=fr["search_s"],
                            nodes_out=model_stats(dst)["nodes"], max_abs=max_abs, scale=scale,
                            speedup=lat["speedup"], iqr=lat["iqr"], ok=max_abs <= 1e-5 * scale)
        rows.append(row)
        print(_format_search_row(row), flush=True)
    return rows


SEARCH_HEADER = ("| model | nodes | T4 cost prepared → after | reduction | search s | max abs diff (scale) | "
                 "ORT CPU speedup, T4-optimized | cpu-cost reduction | ORT CPU speedup, cpu-optimized |\n"
                 "|---|---|---|---|---|---|---|---|---|")


def _format_search_row(r: dict) -> str:
    def red(c):
        return f"{100 * (c['before'] - c['after']) / c['before']:.1f}%"

    def spd(c):
        return f"{c['speedup']:.3f}x ({c['iqr'][0]:.3f}-{c['iqr'][1]:.3f})"

    t, c = r.get("t4", {}), r.get("cpu", {})
    if "error" in t or "error" in c or not t or not c:
        return f"| {r['model']} | {r['nodes']} | FAILED: {t.get('error') or c.get('error')} | | | | | | |"
    diff = max(t["max_abs"], c["max_abs"])
    return (f"| {r['model']} | {r['nodes']} → {t['nodes_out']} | {t['before']:.4g} → {t['after']:.4g} ms | {red(t)} | "
            f"{t['search_s']:.2f} | {diff:.3g} ({max(t['scale'], c['scale']):.3g}) | {spd(t)} | {red(c)} | {spd(c)} |")


TABLE_HEADER = ("| model | exporter | opset | nodes in / out | weights MB | round trip s | peak RSS MB | "
                "max abs diff | output scale | ok |\n|---|---|---|---|---|---|---|---|---|---|")


def _format_row(r: dict) -> str:
    if r.get("rc", 0) != 0:
        return (f"| {r['model']} | {r['exporter']} | {r['opset']} | {r['nodes']} / - | {r['weight_mb']:.1f} | "
                f"{r['wall_s']:.2f} | {r['peak_rss_mb']:.0f} | - | - | FAILED: {r.get('error', '')} |")
    return (f"| {r['model']} | {r['exporter']} | {r['opset']} | {r['nodes']} / {r['nodes_out']} | "
            f"{r['weight_mb']:.1f} | {r['wall_s']:.2f} | {r['peak_rss_mb']:.0f} | {r['max_abs']:.3g} | "
            f"{r['scale']:.3g} | {'yes' if r['ok'] else 'NO'} |")


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m taso_mlir.benchmarks.torch_models", description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?", choices=sorted(MODELS))
    ap.add_argument("output", nargs="?")
    ap.add_argument("--exporter", choices=["torchscript", "dynamo"], default="torchscript")
    ap.add_argument("--measure", nargs="*", metavar="MODEL",
                    help="export, round-trip and compare these models (all if none given), print a table")
    ap.add_argument("--search", nargs="*", metavar="MODEL",
                    help="export these models (all but the big ones if none given), optimize each with taso-search "
                         "(analytic T4 and cost-model=cpu), compare and time both in onnxruntime, print a table")
    ap.add_argument("--workdir", default=None, help="where --measure writes its models (default: a temp dir)")
    a = ap.parse_args(argv)
    if a.workdir and not os.path.isdir(a.workdir):
        ap.error(f"--workdir {a.workdir}: no such directory")
    if a.search is None and a.measure is None and (not a.model or not a.output):
        ap.error("give MODEL OUTPUT, or --measure")
    import importlib.util

    missing = [m for m in ("torch", "onnxscript") if (m == "torch" or a.exporter == "dynamo")
               and importlib.util.find_spec(m) is None]
    if missing:  # (one line, not the traceback of the first import)
        sys.stderr.write(f"{ap.prog}: error: {' and '.join(missing)} not installed: "
                         f"pip install 'taso-mlir[torch]'\n")
        return 1
    if a.search is not None:
        import tempfile

        names = a.search or [n for n, m in MODELS.items() if not m.big]
        versions = ", ".join(f"{k} {v}" for k, v in exporter_versions().items())
        print(f"exporter: {a.exporter} ({versions}), opset {OPSET}\n\n{SEARCH_HEADER}", flush=True)
        with tempfile.TemporaryDirectory(dir=a.workdir) as d:
            rows = measure_search(names, a.exporter, d)
        return 0 if all(r.get(t, {}).get("ok") for r in rows for t in ("t4", "cpu")) else 1
    if a.measure is not None:
        import tempfile

        names = a.measure or list(MODELS)
        versions = ", ".join(f"{k} {v}" for k, v in exporter_versions().items())
        print(f"exporter: {a.exporter} ({versions}), opset {OPSET}\n\n{TABLE_HEADER}", flush=True)
        with tempfile.TemporaryDirectory(dir=a.workdir) as d:
            rows = measure(names, a.exporter, d)
        return 0 if all(r.get("ok") for r in rows) else 1
    if not a.model or not a.output:
        ap.error("give MODEL OUTPUT, or --measure")
    export(a.model, a.output, a.exporter)
    size = os.path.getsize(a.output)
    print(f"{a.model}: {a.output} ({size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
