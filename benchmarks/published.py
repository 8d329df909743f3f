"""Published figures of TASO and TENSAT for the suite's models (not measured here).

Source: the TENSAT paper (Yang et al., MLSys'21, "Equality Saturation for Tensor Graph
Superoptimization"), table of speedups of the optimized graph over the input graph in TASO's cost model
(per-operator runtimes measured on an NVIDIA T4) and the optimizers' running times; and TASO's public
README chart (V100, end-to-end milliseconds, TensorRT vs TASO). Copied from
``../shared/reference/tensat.md`` and ``../shared/reference/taso.md``. Keys are ``SuiteModel.title``.
"""

from __future__ import annotations

from typing import Optional

SOURCE = ("TENSAT paper (MLSys'21), T4 GPU: speedup of the optimized graph over the input graph in TASO's "
          "cost model, and optimizer time")
README_SOURCE = "TASO README chart, V100: end-to-end ms, TensorRT vs TASO"

#: title -> (TASO speedup %, TASO time s, TENSAT speedup %, TENSAT time s)
TENSAT_TABLE: dict[str, tuple[float, float, float, float]] = {
    "BERT": (8.5, 13.6, 9.2, 1.4),
    "ResNeXt-50": (5.5, 25.3, 8.8, 0.7),
    "NasNet-A": (1.9, 1226.0, 7.3, 10.6),
    "NasRNN": (45.4, 177.3, 68.9, 0.5),
    "Inception-v3": (6.3, 68.6, 10.0, 5.1),
    "SqueezeNet": (6.7, 16.4, 24.5, 0.3),
    "VGG-19": (8.9, 8.9, 8.9, 0.4),
}

#: title -> (TensorRT ms, TASO ms) on a V100 (TASO's README; its BERT is BERT-base)
TASO_README_MS: dict[str, tuple[float, float]] = {
    "Inception-v3": (5.5, 5.0),
    "SqueezeNet": (0.93, 0.74),
    "NasNet-A": (10.4, 8.1),
    "ResNeXt-50": (12.7, 4.1),
    "BERT": (1.8, 1.2),
}

#: what the TASO paper says where the tables have no number
NOTES: dict[str, str] = {
    "ResNet-50": "TASO paper (V100): on par with the best of TensorFlow, TF-XLA and TensorRT",
}


def published(title: str) -> Optional[dict]:
    """The published figures for a model title as a dict (speedups as ratios: +8.5% -> 1.085), or None."""
    row = TENSAT_TABLE.get(title)
    readme = TASO_README_MS.get(title)
    note = NOTES.get(title)
    if row is None and readme is None and note is None:
        return None
    out: dict = {"source": SOURCE}
    if row is not None:
        out.update(taso_speedup=1 + row[0] / 100, taso_time_s=row[1], tensat_speedup=1 + row[2] / 100,
                   tensat_time_s=row[3])
    if readme is not None:
        out.update(readme_tensorrt_ms=readme[0], readme_taso_ms=readme[1], readme_source=README_SOURCE)
    if note is not None:
        out["note"] = note
    return out
