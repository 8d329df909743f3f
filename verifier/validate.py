"""Axiom validation: every axiom checked on concrete shapes against the reference semantics.

For each axiom, every parameter setting is combined with shape assignments (every symbol of the
shape templates over dims 1..4, ``k`` and ``kk`` over the odd kernel sizes 1 and 3; sampled when there are too
many) and random float64 inputs in [-1, 1]. An obligation counts when both sides type-check; they
must then agree within 1e-9 (relative 1e-7). An axiom with no obligation fails validation.

At every shape assignment the axiom's Z3 shape conditions (``axioms.axiom_shape_check``: the same
shape rules the prover uses, evaluated with concrete numbers) must hold exactly where both sides
type-check by the operator specs, and give the specs' result shapes: the Z3 form and the numpy form
of an axiom state the same shape conditions, or validation fails.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from ..dialect import specs
from .axioms import AXIOMS, KERNEL_SYMBOLS, Axiom, NumpyAlgebra, axiom_shape_check


@dataclass
class AxiomReport:
    name: str
    doc: str
    obligations: int
    failures: list  # (dims, params, why)


def _symbols(ax: Axiom) -> list[str]:
    syms = []
    for tmpl in ax.tensors.values():
        for d in tmpl.split():
            if not d.isdigit() and d not in syms:
                syms.append(d)
    return syms + [f for f in ax.free if f not in syms]


def validate_axiom(ax: Axiom, max_shapes: int = 48, seed: int = 0) -> AxiomReport:
    rng = np.random.default_rng(seed)
    syms = _symbols(ax)
    domains = [(1, 3) if s in KERNEL_SYMBOLS else (1, 2, 3, 4) for s in syms]
    all_dims = list(itertools.product(*domains))
    if len(all_dims) > max_shapes:
        idx = rng.choice(len(all_dims), size=max_shapes, replace=False)
        all_dims = [all_dims[i] for i in sorted(idx)]
    pnames = list(ax.params)
    n_ok = 0
    failures = []
    for pvals in itertools.product(*[ax.params[p] for p in pnames]) if pnames else [()]:
        params = dict(zip(pnames, pvals))
        for dims in all_dims:
            d = dict(zip(syms, dims))
            if "k" in params:
                d["K0"], d["K1"] = params["k"]
            A = NumpyAlgebra(d)
            vals = {}
            for v, tmpl in ax.tensors.items():
                shape = tuple(int(t) if t.isdigit() else d[t] for t in tmpl.split())
                vals[v] = rng.uniform(-1.0, 1.0, size=shape)
            guard, ldims, rdims = axiom_shape_check(ax, d, params)
            try:
                lhs, rhs = ax.build(A, **vals, **params)
            except specs.SpecError as e:
                if guard:
                    failures.append((d, params, f"the Z3 shape conditions hold but a side does not type-check: {e}"))
                continue  # an axiom claims equality only where both sides type-check
            if not guard:
                failures.append((d, params, "both sides type-check but the Z3 shape conditions do not hold"))
                continue
            if list(lhs.shape) != ldims or list(rhs.shape) != rdims:
                failures.append((d, params, f"Z3 shape rules give {ldims} and {rdims}, the specs {list(lhs.shape)} "
                                            f"and {list(rhs.shape)}"))
                continue
            n_ok += 1
            if lhs.shape != rhs.shape or not np.allclose(lhs, rhs, rtol=1e-7, atol=1e-9):
                diff = "shapes differ" if lhs.shape != rhs.shape else f"max diff {np.max(np.abs(lhs - rhs)):.3g}"
                failures.append((d, params, diff))
    return AxiomReport(ax.name, ax.doc, n_ok, failures)


def validate_all(progress=None) -> list[AxiomReport]:
    out = []
    for ax in AXIOMS:
        out.append(validate_axiom(ax))
        if progress:
            progress(1)
    return out
