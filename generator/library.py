"""The rules file: JSON Lines, one header line then one record per rule (diffable text).

Header: ``{"format": FORMAT, "config": <generator config>, "counts": {stage: n}, "times_s": {...},
"preconditions": [...], "commutative": [...], "verification": {...}}``.

Record: ``{"id", "src", "dst", "inputs", "directions", "fingerprint", "ops", "text", "variants",
"proof"}`` (``ops``: the op count of each side; ``text``: both sides in one line each) where ``src``/``dst`` are ``graph.Graph.to_json()``, output i of src maps to
output i of dst, ``inputs`` gives each input variable's generator shape and kind, ``directions`` lists
the usable directions ("forward": src -> dst, "backward": dst -> src), ``variants`` counts the shape
variants at which both sides were checked numerically, and ``proof`` is ``{"status", "time_s",
"axioms", "reason"}`` (status "unverified" until ``taso-verify`` runs).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from . import graph as G

FORMAT = "taso-mlir rules v1"

#: preconditions every rule carries (checked by whoever applies a rule, e.g. the search pass)
PRECONDITIONS = [
    "ewadd and ewmul operands have equal shapes (no broadcasting)",
    "the target type-checks at the matched shapes and its outputs have the source outputs' shapes",
    "pads='same' on a window op means (k-1)/2 on each side for its odd kernel k",
    "every externally used result of a matched op is a mapped output",
]
#: the generator enumerates one operand order of these; apply rules modulo their commutativity
COMMUTATIVE = ["ewadd", "ewmul"]


#: the shipped libraries: one per generator family (``enumerate.FAMILIES``), rule ids unique across them
SHIPPED = {"base": "rules.jsonl", "base-n4": "rules-n4.jsonl", "conv-bias": "rules-conv-bias.jsonl",
           "matmul-bias": "rules-matmul-bias.jsonl"}
#: the library a family's candidates are derived from by default (``taso-gen --derive-from``)
DERIVE_FROM = {"base-n4": "base"}


def default_path(family: str = "base") -> Path:
    return Path(__file__).resolve().parent / SHIPPED[family]


def shipped_paths() -> list[Path]:
    return [default_path(f) for f in SHIPPED]


def operand_vars(g: G.Graph) -> set:
    vs = {r for op in g.ops for r in op.operands if not r.startswith("%")}
    return vs | {r for r in g.outputs if not r.startswith("%")}


def usable(src: G.Graph, dst: G.Graph) -> bool:
    """src -> dst is a usable rewrite: src has ops and binds every variable both sides mention."""
    return bool(src.ops) and set(src.inputs()) | set(dst.inputs()) <= operand_vars(src)


def write(path, header: dict, records: list[dict]) -> None:
    """Write atomically (a temporary file in the same folder, then rename)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=str(path.parent or "."))
    try:
        try:
            mode = path.stat().st_mode & 0o777  # keep the mode of the file replaced
        except OSError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps({"format": FORMAT, **header}, sort_keys=True) + "\n")
            for r in records:
                f.write(json.dumps(r, sort_keys=True) + "\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


class LibraryError(ValueError):
    pass


#: the fields every rule record has (``proof`` with its ``status``)
RECORD_FIELDS = ("id", "src", "dst", "inputs", "directions", "proof")


def read(path=None) -> tuple[dict, list[dict]]:
    path = Path(path or default_path())
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise LibraryError(f"{path}: cannot read the rules file: {e.strerror or e}") from None
    try:
        header = json.loads(lines[0]) if lines else {}
    except json.JSONDecodeError:
        header = {}
    if header.get("format") != FORMAT:
        raise LibraryError(f"{path}: not a taso-mlir rules file (expected a first line with format '{FORMAT}')")
    records = []
    for n, line in enumerate(lines[1:], start=2):
        try:
            r = json.loads(line)
        except json.JSONDecodeError as e:
            raise LibraryError(f"{path}:{n}: malformed rule record: {e.msg}") from None
        if not (isinstance(r, dict) and all(k in r for k in RECORD_FIELDS) and isinstance(r["proof"], dict)
                and "status" in r["proof"]):
            raise LibraryError(f"{path}:{n}: not a usable rules file: a rule record needs "
                               f"{', '.join(RECORD_FIELDS)} and proof.status")
        records.append(r)
    return header, records


def rules(path=None, status: str | None = "proved") -> list[tuple[dict, G.Graph, G.Graph]]:
    """(record, src graph, dst graph) of the rules with the given proof status (None: all)."""
    _, records = read(path)
    out = []
    for r in records:
        if status is None or r["proof"]["status"] == status:
            out.append((r, G.Graph.from_json(r["src"]), G.Graph.from_json(r["dst"])))
    return out
