"""The signature dump for the GPU calibration (passes/cost/calibration.py, issue 24): the recording wrapper
sees every signature the search prices, the file is deduplicated, sorted and reads back to the same
signatures, and the torch-exported models are skipped with a reason where torch is missing."""

from __future__ import annotations

import importlib.util
import json

import pytest

from taso_mlir.passes.cost import calibration as C
from taso_mlir.passes.cost.oracle import Analytic, CostModel, describe, get_cost_model, is_measured, \
    wrapping_cost_models

from test_cost import EVERY_OP


def test_recording_wraps_only_inside_the_block_and_prices_as_the_inner_model():
    col = C.Collector()
    with wrapping_cost_models(lambda cm: C.Recording(cm, col)):
        rec = get_cost_model("analytic:v100")
    plain = get_cost_model("analytic:v100")
    assert isinstance(rec, C.Recording) and isinstance(plain, Analytic)
    assert rec.name == "analytic:v100" and not is_measured(rec)
    assert describe(rec) == describe(plain) == "estimated by the analytic roofline of an NVIDIA V100"
    for sig in EVERY_OP + EVERY_OP:  # (twice: recorded once)
        assert rec.cost(sig) == plain.cost(sig)
    assert sorted(col.sigs) == sorted({s.key() for s in EVERY_OP})
    # free signatures (weights, constants) are never priced, so never recorded
    w = EVERY_OP[0].__class__("weight", (), (), ((4, 4),))
    assert rec.cost(w) == 0.0 and w.key() not in col.sigs


def test_records_read_back_to_the_same_signatures():
    for sig in EVERY_OP:
        r = json.loads(json.dumps(C.sig_record(sig)))
        back = C.sig_from_record(r)
        assert back.key() == sig.key() == r["key"]
        assert back == sig


@pytest.fixture(scope="module")
def dumped(tmp_path_factory):
    out = tmp_path_factory.mktemp("sigs") / "sigs.jsonl"
    rc = C.main(["dump", "--quick", "--models", "nasrnn,squeezenet", "--no-torch", "--targets", "analytic:t4",
                 "--strategies", "backtracking,eqsat", "-o", str(out)])
    assert rc == 0
    return out


def test_dump_file_is_a_sorted_deduplicated_set_with_a_header(dumped):
    lines = dumped.read_text().splitlines()
    header = json.loads(lines[0])
    assert header["header"] and header["format"] == C.FORMAT
    assert header["models"] == ["nasrnn", "squeezenet"] and header["strategies"] == ["backtracking", "eqsat"]
    assert header["commit"] and header["date"].endswith("Z")
    assert len(header["runs"]) == 4 and all("error" not in r for r in header["runs"])
    recs = [json.loads(x) for x in lines[1:]]
    keys = [r["key"] for r in recs]
    assert keys == sorted(set(keys))
    assert header["counts"]["signatures"] == len(recs)
    assert sum(header["counts"]["by_kind"].values()) == len(recs)
    # both models' ops are there, and every record is a signature the analytic model prices above zero
    kinds = {r["kind"] for r in recs}
    assert {"matmul", "conv2d", "concat", "relu"} <= kinds
    t4 = get_cost_model("analytic:t4")
    for r in recs:
        sig = C.sig_from_record(r)
        assert sig.key() == r["key"]
        assert t4.cost(sig) > 0 or sig.kind == "reshape" or sig.kind.startswith("onnx.")
        assert r["models"] in (1, 2) and r["rank"] >= 0
    assert C.read_signatures(str(dumped))[1] == recs


def test_dump_covers_every_signature_a_search_prices(dumped, tmp_path):
    """Searching again the same way prices no signature missing from the file."""
    known = {json.loads(x)["key"] for x in dumped.read_text().splitlines()[1:]}

    class Misses(CostModel):
        def __init__(self, inner):
            super().__init__()
            self.inner, self.missing = inner, set()

        def _cost(self, sig):
            if sig.key() not in known:
                self.missing.add(sig.key())
            return self.inner.cost(sig)

    seen = []
    from taso_mlir.benchmarks.suite import build

    with wrapping_cost_models(lambda cm: seen.append(Misses(cm)) or seen[-1]):
        C.search_model(build("nasrnn", quick=True), "nasrnn", "analytic:t4", "backtracking", 30.0)
    assert seen and all(not m.missing for m in seen)


def test_bad_model_name_and_unreadable_file(tmp_path, capsys):
    assert C.main(["dump", "--quick", "--models", "nope", "-o", str(tmp_path / "x.jsonl")]) == 1
    assert "unknown suite model(s) nope" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kind": "relu"}\n')
    with pytest.raises(Exception, match="not a taso-mlir signatures file"):
        C.read_signatures(str(bad))


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed: nothing is skipped")
def test_torch_models_are_skipped_with_a_reason_without_torch(tmp_path, capsys):
    out = tmp_path / "t.jsonl"
    assert C.main(["dump", "--models", "torch:resnet18", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "torch is not installed" in err and "resnet18" in err
    header = json.loads(out.read_text().splitlines()[0])
    assert header["models"] == [] and "torch is not installed" in header["skipped"][0]
