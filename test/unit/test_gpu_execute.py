"""The GPU speedup run (benchmarks/gpu: execute.py, torch_exec.py, speedup.py, run_speedup.sh; issue 25),
rehearsed on the CPU: the prepared models are small and complete, every op in them is planned by the primary
executor and read by the torch interpreter, the dry executor matches onnxruntime on suite models (original and
optimized), the speedup loop checks before it times, stops at its budget with its results written, reports a
mismatch as one, and the prepared command runs end to end in dry mode. The CUDA paths run only where a GPU is
(skipped here with the reason)."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from unit_helpers import GPU_BENCH as GPU
from unit_helpers import ROOT
from unit_helpers import gpu_manifest as manifest

MODELS = GPU / "models"
sys.path.insert(0, str(GPU))

import calibrate as CAL  # noqa: E402
import execute as E  # noqa: E402
import speedup as SP  # noqa: E402
import torch_exec as TE  # noqa: E402


RES = ROOT / "benchmarks" / "results" / "gpu"
#: the committed GPU runs, in the order benchmarks/RESULTS-gpu.md shows them
RUNS = [RES / f"speedup-{n}.json" for n in ("h100", "h100-cuda", "h200")]


def _committed_report(tmp_path, runs=None) -> Path:
    """The page report.py writes from the committed runs (default: all, as RESULTS-gpu.md; the charts to
    tmp_path)."""
    pytest.importorskip("matplotlib")
    md = tmp_path / "R.md"
    r = subprocess.run([sys.executable, str(GPU / "report.py"), *map(str, runs or RUNS), "--md", str(md),
                        "--chart-dir", str(tmp_path)], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    return md


def files(s: str) -> list:
    return sorted((MODELS / s).glob("*.onnx"))


def _gpu() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


NO_GPU = "no CUDA GPU here (torch with CUDA is needed): the CUDA executors are untested on this machine; " \
         "benchmarks/gpu/run_speedup.sh runs them on the GPU machine"
NO_TORCH = "torch is not installed here: the torch interpreter (torch_exec.py) cannot run; its op table is " \
           "checked against the prepared models instead"


# ---------------------------------------------------------------------------------------------------------
# the prepared models


@pytest.mark.parametrize("s", ["full", "quick"])
def test_prepared_sets_are_complete_small_and_consistent(s):
    man = manifest(s)
    assert man["format"] == "taso-mlir gpu speedup manifest 1" and man["set"] == s
    names = {m["name"] for m in man["models"]}
    assert {"bert-b1", "bert-b16", "resnext50", "nasnet-a", "nasrnn", "inception3", "squeezenet", "vgg19",
            "resnet50"} <= names
    on_disk = {p.name for p in files(s)}
    listed = set()
    for m in man["models"]:
        assert "error" not in m, m.get("error")
        assert set(m["variants"]) >= {"original", "opt-analytic-t4", "opt-analytic-h100"}
        for v, e in m["variants"].items():
            assert e["file"] in m["files"]
            if v != "original":  # checked on the CPU with the real weights
                assert e["search"]["rel_err_vs_original"] <= 1e-4, (m["name"], v)
        for f, fe in m["files"].items():
            listed.add(f)
            assert fe["predicted"]["total_ms"]["analytic:h100"] > 0 and fe["predicted"]["ops"]
            assert fe["bytes"] == (MODELS / s / f).stat().st_size
    assert listed == on_disk
    # weights stripped: the whole set is small (the full suite's weights are 2 GB)
    assert sum((MODELS / s / f).stat().st_size for f in on_disk) < 8e6


def test_every_op_in_the_prepared_models_is_planned_and_read_by_both_executors():
    """Every ONNX op type of every prepared file has a plan in execute.py and a torch op in torch_exec.py, and
    every full-size file is planned without an error (shapes, constants, fusion)."""
    import onnx

    ops = set()
    for s in ("full", "quick", "torch"):
        for p in files(s):
            ops |= {n.op_type for n in onnx.load(str(p), load_external_data=False).graph.node}
    assert {"Conv", "MatMul", "Gemm", "Concat", "Split", "Softmax", "LayerNormalization", "GlobalAveragePool",
            "Erf", "Gather", "BatchNormalization", "Clip", "Equal", "Where", "Expand", "ReduceMean"} <= ops
    assert ops <= set(E.PLANNED_OPS), ops - set(E.PLANNED_OPS)
    assert ops <= set(TE.OPS), ops - set(TE.OPS)
    assert set(TE.OPS) >= set(E.PLANNED_OPS)  # the second opinion reads whatever the primary plans
    # every quick file (the full ones' structure at tiny widths; their weights would take 2 GB to draw here)
    for p in files("quick") + files("torch"):  # (the torch set's weights are small enough to draw)
        gp = E.plan_graph(E.load_model(str(p)))
        assert gp.steps and set(gp.summary()["onnx_ops"]) <= set(E.PLANNED_OPS)


def _generic_ops_model():
    """Clip (bounds as inputs, and as a missing min), Equal, Where, Expand, ReduceMean, and shape arithmetic on
    constants (Shape, Mod, ConstantOfShape) that the planner folds on the host."""
    from onnx import TensorProto, helper, numpy_helper

    c = [numpy_helper.from_array(np.array(v, dtype=d), n) for n, v, d in (
        ("lo", 0.0, np.float32), ("hi", 0.5, np.float32), ("pad", 3, np.int64), ("three", 3, np.int64),
        ("zero", 0.0, np.float32))]
    nodes = [
        helper.make_node("Clip", ["x", "lo", "hi"], ["c1"]),
        helper.make_node("Clip", ["x", "", "hi"], ["c2"]),
        helper.make_node("Equal", ["ids", "pad"], ["eq"]),
        helper.make_node("Where", ["eq", "zero", "c1"], ["w"]),
        helper.make_node("Shape", ["x"], ["shp"]),
        helper.make_node("Mod", ["shp", "three"], ["md"]),  # [2, 1]
        helper.make_node("ConstantOfShape", ["md"], ["ones"], value=numpy_helper.from_array(
            np.array([1.0], dtype=np.float32))),
        helper.make_node("ReduceMean", ["x"], ["rm"], axes=[1], keepdims=1),
        helper.make_node("Expand", ["rm", "shp"], ["ex"]),
        helper.make_node("Add", ["ex", "c2"], ["s0"]),
        helper.make_node("Add", ["s0", "ones"], ["s"]),
        helper.make_node("Add", ["s", "w"], ["t"]),
        helper.make_node("ReduceMean", ["t"], ["y"], axes=[1], keepdims=0),
    ]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4]),
                                       helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], c)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_the_torch_exported_models_generic_ops_are_planned_and_match_onnxruntime():
    """The ops the torch-exported models add (ReLU6 as Clip; an attention mask's Equal, Where and Expand; a
    ReduceMean), each planned and run by the dry runner (numpy, as the GPU run's check) and by the torch
    interpreter on the CPU where torch is installed, against onnxruntime; the shape arithmetic on constants is
    folded on the host (by onnx's reference evaluator where no kernel plan has it)."""
    m = _generic_ops_model()
    gp = E.plan_graph(m)
    plans = gp.summary()["kernels_by_plan"]
    assert {"clip": 2, "equal": 1, "where": 1, "expand": 1, "reduce_mean": 2}.items() <= plans.items(), plans
    assert gp.folded >= 3  # Shape, Mod, ConstantOfShape
    clips = [st.plan.p for st in gp.steps if st.plan.op == "clip"]
    assert clips == [{"lo": 0.0, "hi": 0.5}, {"lo": None, "hi": 0.5}]
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((2, 4)).astype(np.float32), "ids": np.array([[3, 1, 3, 0], [2, 3, 5, 3]])}
    want = E.ort_outputs(m, feeds)["y"]
    r = E.DryRunner(gp, feeds)
    r.run()
    assert np.allclose(r.outputs()["y"], want, rtol=1e-6, atol=1e-6)
    if importlib.util.find_spec("torch") is None:
        pytest.skip(NO_TORCH)
    import prepare as P

    folded = P.fold_shape_arithmetic(m)  # (the torch set's files are folded so: the interpreter runs no Shape)
    assert not {"Shape", "Mod", "ConstantOfShape"} & {n.op_type for n in folded.graph.node}
    assert np.allclose(E.ort_outputs(folded, feeds)["y"], want, rtol=1e-6, atol=1e-6)
    t = TE.TorchRunner(folded, feeds, graph=False, device="cpu")
    t.run()
    assert np.allclose(t.outputs()["y"], want, rtol=1e-6, atol=1e-6)


def test_torch_interpreter_reads_shapes_and_axes_on_the_host():
    """Every Reshape shape, Split sizes, Squeeze/Unsqueeze axes and scalar Gather index of the prepared files is a
    constant the torch interpreter keeps on the host (``torch_exec.host_input``): a run never reads a CUDA tensor
    back (``.tolist()``: a sync, and an error inside a CUDA graph capture)."""
    import onnx
    from onnx import numpy_helper

    checked = 0
    for s in ("full", "quick"):
        for p in files(s):
            g = onnx.load(str(p), load_external_data=False).graph
            shapes = {t.name: tuple(t.dims) for t in g.initializer}
            for nd in g.node:
                if nd.op_type == "Constant":
                    shapes[nd.output[0]] = tuple(numpy_helper.to_array(nd.attribute[0].t).shape) \
                        if nd.attribute[0].name == "value" else ()
                    continue
                ins = list(nd.input)
                if all((not x) or x in shapes for x in ins):  # folded when the model is loaded
                    continue
                pos = TE.HOST_INPUTS.get(nd.op_type)
                if pos is None or pos >= len(ins) or not ins[pos]:
                    continue
                if nd.op_type == "Gather" and shapes.get(ins[pos]) != ():
                    continue
                assert TE.host_input(nd.op_type, ins, shapes) == pos, (p.name, nd.name, nd.op_type)
                checked += 1
    assert checked > 100
    assert TE.host_input("Gather", ["x", "i"], {"i": (4,)}) is None
    assert TE.host_input("Reshape", ["x", "s"], {}) is None


def test_torch_interpreter_keeps_scalar_constants_scalar():
    """A 0-d Constant (NasRNN's Gather indices) stays 0-d: np.ascontiguousarray would make it 1-d, Gather would then
    keep the axis, and the output's shape would differ from onnxruntime's (seen on the GPU: NasRNN's torch check
    failed with an infinite error)."""
    import types

    from onnx import numpy_helper

    fake = types.SimpleNamespace(from_numpy=lambda a: a, nn=types.SimpleNamespace(functional=None))
    ops = TE._Ops(fake)
    (v,) = ops.constant({"value": numpy_helper.from_array(np.array(2, np.int64))})
    assert v.shape == () and v.flags.writeable
    (v,) = ops.constant({"value_ints": [0]})
    assert v.shape == (1,)


def test_weights_are_drawn_from_the_recorded_statistics():
    import onnx
    from onnx import numpy_helper

    p = MODELS / "full" / "squeezenet.original.onnx"
    m = onnx.load(str(p))
    stripped = [t for t in m.graph.initializer if t.doc_string.startswith(E.WEIGHTS_KEY)]
    assert stripped and all(not t.raw_data and not t.float_data for t in stripped)
    stats = {t.name: json.loads(t.doc_string.split(" ", 1)[1]) for t in stripped}
    assert E.fill_weights(m, seed=0) == len(stripped)
    for t in m.graph.initializer:
        if t.name in stats:
            a, st = numpy_helper.to_array(t), stats[t.name]
            assert a.shape == tuple(t.dims) and a.dtype == np.float32
            assert st["min"] - 1e-6 <= a.min() and a.max() <= st["max"] + 1e-6
            assert abs(a.mean() - st["mean"]) <= 0.2 * st["std"] + 1e-6
    # deterministic: the same seed gives the same weights
    m2 = onnx.load(str(p))
    E.fill_weights(m2, seed=0)
    assert all(a.raw_data == b.raw_data for a, b in zip(m.graph.initializer, m2.graph.initializer))


# ---------------------------------------------------------------------------------------------------------
# the dry executor against onnxruntime


@pytest.mark.parametrize("path", [
    "quick/bert-b1.original.onnx", "quick/bert-b1.opt-analytic-t4.onnx", "quick/nasnet-a.original.onnx",
    "quick/nasnet-a.opt-analytic-t4.onnx", "quick/inception3.opt-analytic-t4.onnx",
    "quick/resnext50.opt-analytic-t4.onnx", "full/nasrnn.original.onnx", "full/nasrnn.opt-analytic-h100.onnx",
    "full/squeezenet.original.onnx", "full/squeezenet.opt-analytic-t4.onnx",
])
def test_dry_executor_matches_onnxruntime(path):
    m = E.load_model(str(MODELS / path))
    gp = E.plan_graph(m)
    feeds = E.random_feeds(m, seed=3)
    ref = E.ort_outputs(m, feeds)
    r = E.DryRunner(gp, feeds)
    c = E.check(r, ref)
    assert c["ok"] and c["rel_err"] < 1e-4 and c["outputs"] == len(ref), c
    out = r.outputs()
    assert all(np.isfinite(v).all() and np.abs(v).max() > 0 for v in out.values())


def test_the_check_catches_a_wrong_kernel(monkeypatch):
    """A kernel that computes the wrong thing (sigmoid for tanh) fails the check: the check can fail."""
    import calibrate as C

    m = E.load_model(str(MODELS / "quick" / "nasrnn.original.onnx"))
    gp = E.plan_graph(m)
    feeds = E.random_feeds(m)
    ref = E.ort_outputs(m, feeds)
    monkeypatch.setitem(C._NP_UNARY, "tanh", C._NP_UNARY["sigmoid"])
    c = E.check(E.DryRunner(gp, feeds), ref)
    assert not c["ok"] and c["rel_err"] > 1e-2


def test_plan_folds_constants_and_fuses_relu():
    gp = E.plan_graph(E.load_model(str(MODELS / "full" / "nasrnn.original.onnx")))
    s = gp.summary()
    assert s["folded_nodes"] > 0 and "Constant" not in s["onnx_ops"]
    assert s["kernels_by_plan"]["select"] == 5  # x[t]: a view, no kernel
    gp = E.plan_graph(E.load_model(str(MODELS / "full" / "squeezenet.opt-analytic-t4.onnx")))
    assert gp.fused == gp.summary()["onnx_ops"]["Relu"] > 0  # every Relu rides on its Conv
    assert all(st.plan.p["act"] == "relu" for st in gp.steps if st.plan.op == "conv2d")


def test_unsupported_ops_are_one_line_errors(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Hardmax", ["x"], ["y"], name="hm")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(E.Unsupported, match=r"node 'hm' \(Hardmax\): no kernel for ONNX op Hardmax"):
        E.plan_graph(m)
    p = tmp_path / "hm.onnx"
    onnx.save(m, str(p))
    r = subprocess.run([sys.executable, str(GPU / "execute.py"), str(p), "--dry-run"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().startswith("execute: error: node 'hm' (Hardmax)")
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_execute_cli_dry_run():
    r = subprocess.run([sys.executable, str(GPU / "execute.py"), str(MODELS / "quick" / "squeezenet.original.onnx"),
                        "--dry-run", "--repeats", "3"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert " ok" in r.stdout and "not a GPU timing" in r.stdout


# ---------------------------------------------------------------------------------------------------------
# the speedup loop, dry


def run_speedup(*args, timeout=300):
    return subprocess.run([sys.executable, str(GPU / "speedup.py"), "--dry-run", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def _measured(man_model: dict) -> list:
    """A manifest model's variants optimized for a measured table (``opt-cuda-*``), in the manifest's order."""
    return [v for v in man_model["variants"] if v.startswith("opt-cuda-")]


def _later_files(man_model: dict) -> set:
    """The files only the measured tables' searches exported (the later pass times them)."""
    v = man_model["variants"]
    return {v[x]["file"] for x in _measured(man_model)} - {e["file"] for x, e in v.items() if x not in
                                                             _measured(man_model)}


def test_dry_speedup_run_checks_times_and_reports(tmp_path):
    """Each model's original and analytic graphs first; then, after every model's, the graphs optimized for the
    measured tables (cuda:h100, cuda:h200) where their searches exported a graph of their own (quick NasRNN and
    BERT), each timed against the original again; where one exported the analytic search's graph (quick
    SqueezeNet), that file is timed once and the measured table's ratio is its ratio."""
    out = tmp_path / "s.json"
    r = run_speedup("--set", "quick", "--models", "nasrnn,squeezenet,bert-b1", "--min-rounds", "3",
                    "--max-rounds", "3", "--runs", "2", "--out", out, "--budget-s", "120")
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(out.read_text())
    assert res["complete"] and res["method"]["backend"] == "dry" and "torch" in res["method"]["skipped_executors"]
    assert [m["name"] for m in res["models"]] == ["squeezenet", "nasrnn", "bert-b1"] or len(res["models"]) == 3
    assert not res["not_reached"] and not res["later_not_reached"]
    man = {m["name"]: m for m in manifest("quick")["models"]}
    own = [n for n in ("nasrnn", "squeezenet", "bert-b1") if _later_files(man[n])]
    assert sorted(own) == ["bert-b1", "nasrnn"]
    # the later pass after every model's first: its lines last
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("speedup: ") and "[" in ln]
    later = [i for i, ln in enumerate(lines) if "(later: cuda:" in ln]
    assert len(lines) == 3 + len(own) and later == list(range(3, 3 + len(own))), lines
    assert res["passes"]["first_files"] == sum(len(set(e["file"] for v, e in man[n]["variants"].items()
                                                       if v not in _measured(man[n]))) for n in man
                                               if n in ("nasrnn", "squeezenet", "bert-b1"))
    for m in res["models"]:
        assert m["status"] == "ok" and m["rounds"] == 3, m
        for f, fe in m["files"].items():
            assert fe["executors"]["taso"]["status"] == "ok" and fe["executors"]["taso"]["check"]["rel_err"] < 1e-4
            assert fe["digest"] == man[m["name"]]["files"][f]["digest"]
            assert len(SP.timing_of(m, "taso", f)["rounds"]) == 3
        sp = m["speedup"]["taso"]
        assert set(sp) == {"opt-analytic-t4", "opt-analytic-h100", "opt-cuda-h100", "opt-cuda-h200"}
        for s in sp.values():
            assert s["rounds"] == 3 and s["q1"] <= s["median"] <= s["q3"]
        first = {e["file"] for v, e in man[m["name"]]["variants"].items() if v not in _measured(man[m["name"]])}
        for v in _measured(man[m["name"]]):
            cuda = man[m["name"]]["variants"][v]
            if cuda["file"] in first:  # an analytic search's graph: one file, timed once, in the first pass
                assert "pass" not in sp[v] and m["same_graph_as"][v] == cuda["same_graph_as"]
                assert sp[v] == sp[cuda["same_graph_as"]["variants"][0]]
            else:  # a graph of the measured tables' own: the later pass, with the original again
                orig = m["variants"]["original"]
                lt = m["later"]
                assert lt["status"] == "ok" and lt["rounds"] == 3 and cuda["file"] in lt["graphs"]
                assert set(lt["timing"]["taso"]) == {orig} | set(lt["graphs"])
                assert cuda["file"] not in m["timing"]["taso"]
                assert sp[v]["pass"] == "later" and "pass" not in sp["opt-analytic-t4"]
                assert sp[v]["median"] == pytest.approx(SP.ratio_stats(
                    lt["timing"]["taso"][orig]["rounds"], lt["timing"]["taso"][cuda["file"]]["rounds"])["median"])
        for f, row in m["fidelity"].items():
            assert row["measured_ms"] > 0 and row["predicted_ms"]["analytic:h100"] > 0
            assert row["predicted_ms"]["cuda:h200"] > 0 and row["predicted_ms"]["cuda:h100"] > 0
    md = (tmp_path / "RESULTS-gpu.md").read_text()
    assert "DRY RUN" in md and "| NasRNN |" in md and "Cost-model fidelity" in md
    assert ("| model | status | rounds | taso: analytic:t4 | taso: analytic:h100 | taso: cuda:h100 | "
            "taso: cuda:h200 |") in md
    assert "| NasRNN | ok | 3 + 3 |" in md and "| SqueezeNet | ok | 3 | " in md
    assert md.count("same graph as analytic:t4") >= 3  # squeezenet's h100 and cuda:h200, nasrnn's h100
    assert "nasrnn.original.onnx (again, in the later pass)" in md


def test_variants_and_later_choose_what_is_timed_and_when(tmp_path):
    """--variants cuda:h200: the original and that graph alone, in one pass (a later call after a calibration);
    --later '': every graph in one pass; an unknown variant: exit 2 naming it."""
    out = tmp_path / "v.json"
    r = run_speedup("--set", "quick", "--models", "nasrnn,squeezenet", "--variants", "cuda:h200", "--min-rounds",
                    "2", "--max-rounds", "2", "--runs", "1", "--out", out)
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(out.read_text())
    assert res["method"]["variants"] == ["opt-cuda-h200"] and res["complete"]
    for m in res["models"]:
        assert set(m["variants"]) == {"original", "opt-cuda-h200"} and "later" not in m
        assert set(m["speedup"]["taso"]) == {"opt-cuda-h200"} and m["rounds"] == 2
        assert set(m["timing"]["taso"]) == set(m["variants"].values())
    out = tmp_path / "one.json"
    r = run_speedup("--set", "quick", "--models", "nasrnn", "--later", "", "--min-rounds", "2", "--max-rounds", "2",
                    "--runs", "1", "--out", out)
    assert r.returncode == 0, r.stdout + r.stderr
    m = json.loads(out.read_text())["models"][0]
    assert "later" not in m and len(m["timing"]["taso"]) == len(set(m["variants"].values())) == 3
    assert "pass" not in m["speedup"]["taso"]["opt-cuda-h200"]
    r = run_speedup("--set", "quick", "--variants", "cuda:h999", "--out", tmp_path / "x.json")
    assert r.returncode == 2 and "opt-cuda-h999" in r.stderr


def test_the_later_graphs_never_push_a_first_comparison_out_of_the_budget(tmp_path, monkeypatch):
    """The scheduling on the full set's plan, with a simulated clock (each file 1 s to load and check, each
    round 0.1 s a file): a budget too short for everything still reaches every model's original vs analytic
    comparison; the cuda:h200 graphs take what is left, and those not reached are named. With the budget for
    all of it, every pass completes."""
    import types

    clock = [0.0]
    monkeypatch.setattr(SP, "time", types.SimpleNamespace(monotonic=lambda: clock[0], sleep=lambda s: None))
    monkeypatch.setattr(SP.Run, "_start_watchdog", lambda self: setattr(self, "_stop", False))
    calls = []

    def fake_model(self, m, files, until, part):
        calls.append((m["name"], list(files)))
        for f in files:
            clock[0] += 1.0
            part["files"][f] = {"executors": {"taso": {"status": "ok", "check": {"ok": True, "rel_err": 0.0},
                                                       "mode": "simulated"}}}
        n = 0
        while n < self.args.max_rounds and clock[0] < self.deadline and (n < self.args.min_rounds or clock[0] < until):
            clock[0] += 0.1 * len(files)
            n += 1
        part["rounds"] = n
        for k, f in enumerate(files):
            part["timing"].setdefault("taso", {})[f] = {"median_ms": 1.0 + k, "q1_ms": 1.0 + k, "q3_ms": 1.0 + k,
                                                        "rounds": [1.0 + k] * n}
    monkeypatch.setattr(SP.Run, "model", fake_model)
    man = manifest("full")
    first_files = sum(len({e["file"] for v, e in m["variants"].items() if v not in _measured(m)})
                      for m in man["models"])
    own = [m["name"] for m in man["models"] if _later_files(m)]
    later = {f for m in man["models"] for f in _later_files(m)}
    # short: the first pass's loads and 5 rounds each fit, not the later pass's
    budget = first_files * (1.0 + 0.5) + 3 + 6
    out = tmp_path / "s.json"
    assert SP.main(["--dry-run", "--set", "full", "--out", str(out), "--budget-s", str(budget), "--reserve-s", "3",
                    "--executors", "taso"]) == 0
    res = json.loads(out.read_text())
    assert [m["name"] for m in res["models"]] == [m["name"] for m in SP.model_order(man)]
    assert all(m["status"] == "ok" and m["rounds"] >= 5 for m in res["models"])
    assert not res["not_reached"] and res["later_not_reached"] and not res["complete"]
    assert "later graphs" in res["stopped"]
    done = [m["name"] for m in res["models"] if m.get("later")]
    assert done + res["later_not_reached"] == [n for n in (m["name"] for m in res["models"]) if n in own]
    # the first pass ran every model before any later graph
    firsts = [c for c in calls if not any(f in later for f in c[1])]
    assert calls[:len(firsts)] == firsts and len(firsts) == len(man["models"])
    # with room for everything: every measured table's graph of its own timed, with its original
    calls.clear()
    clock[0] = 0.0
    assert SP.main(["--dry-run", "--set", "full", "--out", str(out), "--budget-s", "600",
                    "--executors", "taso"]) == 0
    res = json.loads(out.read_text())
    assert res["complete"] and not res["later_not_reached"]
    assert sorted(m["name"] for m in res["models"] if m.get("later")) == sorted(own)
    for m in res["models"]:
        assert all(m["speedup"]["taso"][v]["rounds"] > 0 for v in ("opt-cuda-h100", "opt-cuda-h200"))


def test_budget_stops_with_results_written(tmp_path):
    out = tmp_path / "s.json"
    r = run_speedup("--set", "quick", "--out", out, "--budget-s", "0.5", "--reserve-s", "0")
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert not res["complete"] and "budget" in res["stopped"] and res["not_reached"]
    assert len(res["models"]) + len(res["not_reached"]) == len(manifest("quick")["models"])


def test_a_mismatch_is_reported_and_not_timed(tmp_path):
    """A file whose executor output differs from onnxruntime's: 'mismatch', no timing, exit 1."""
    code = f"""
import sys; sys.path.insert(0, {str(GPU)!r})
import calibrate as C, speedup as SP
C._NP_UNARY["tanh"] = C._NP_UNARY["sigmoid"]
sys.exit(SP.main(["--dry-run", "--set", "quick", "--models", "nasrnn", "--out", {str(tmp_path / 's.json')!r},
                  "--min-rounds", "2", "--max-rounds", "2", "--runs", "1"]))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    res = json.loads((tmp_path / "s.json").read_text())
    m = res["models"][0]
    assert m["status"] == "mismatch" and not m.get("speedup", {}).get("taso")
    assert all(fe["executors"]["taso"]["status"] == "mismatch" for fe in m["files"].values())
    assert "mismatches: nasrnn" in r.stdout


def test_watchdog_writes_and_exits_on_a_hang(tmp_path):
    code = f"""
import sys, time; sys.path.insert(0, {str(GPU)!r})
import execute as E, speedup as SP
orig = E.DryRunner.time
def slow(self, *a):
    time.sleep(60)
E.DryRunner.time = slow
SP.main(["--dry-run", "--set", "quick", "--models", "squeezenet", "--out", {str(tmp_path / 's.json')!r},
         "--hang-s", "2"])
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, r.stdout + r.stderr
    res = json.loads((tmp_path / "s.json").read_text())
    assert "watchdog" in res["stopped"] and not res["complete"]
    # what was known of the model under way is written: its files checked before the hang
    (m,) = res["models"]
    assert m["files"] and all(fe["executors"]["taso"]["status"] == "ok" for fe in m["files"].values())


def test_fidelity_prices_the_files_with_a_calibration_table(tmp_path):
    """--table: each file's ops priced by the table's entries where it has them, counted."""
    man = manifest("quick")
    m = next(x for x in man["models"] if x["name"] == "squeezenet")
    ops = m["files"][m["variants"]["original"]["file"]]["predicted"]["ops"]
    key = ops[0][0]
    table = {"format": "taso-mlir cuda table 1", "name": "test", "device": {"gpu": "synthetic (test)"},
             "entries": {key: {"ms": 1.0}}, "complete": False}
    tp = tmp_path / "t.json"
    tp.write_text(json.dumps(table))
    t = SP.table_cost(SP.load_table(str(tp)), ops)
    n = sum(o[2] for o in ops)
    assert t["measured_ops"] == ops[0][2] and t["estimated_ops"] == n - ops[0][2]
    want = ops[0][2] * 1.0 + sum(o[2] * o[3]["analytic:h100"] for o in ops[1:])
    assert t["ms"] == pytest.approx(want)
    out = tmp_path / "s.json"
    r = run_speedup("--set", "quick", "--models", "squeezenet", "--table", tp, "--out", out, "--min-rounds", "1",
                    "--max-rounds", "1", "--runs", "1")
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert res["table"]["name"] == "test" and all("table" in row for row in res["models"][0]["fidelity"].values())


def test_ratio_statistics():
    s = SP.ratio_stats([2.0, 2.2, 1.8, 2.0], [1.0, 1.0, 1.0, 1.0])
    assert s["median"] == pytest.approx(2.0) and s["resolved"] and s["rounds"] == 4
    s = SP.ratio_stats([1.0, 1.1, 0.9, 1.0], [1.0, 1.0, 1.0, 1.0])
    assert not s["resolved"] and s["q1"] <= 1.0 <= s["q3"]


def test_scripts_import_only_what_the_gpu_machine_has():
    std = set(sys.stdlib_module_names) | {"__future__"}
    gpu_side = {"numpy", "onnx", "onnxruntime", "torch", "cupy", "cuda", "calibrate", "execute", "torch_exec"}
    for name in ("execute.py", "speedup.py", "torch_exec.py"):
        tree = ast.parse((GPU / name).read_text())
        mods = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                ns = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                mods.update(n.split(".")[0] for n in ns)
        assert mods <= std | gpu_side, (name, mods - std - gpu_side)


def test_report_writes_markdown_and_chart(tmp_path):
    """A column and a chart series per cost model (analytic:t4, analytic:h100, cuda:h200, in that order); a graph
    the same as an earlier cost model's named so; the targets' best ratio names its cost model."""
    pytest.importorskip("matplotlib")
    import report as RP

    out = tmp_path / "s.json"
    assert run_speedup("--set", "quick", "--models", "squeezenet,nasrnn", "--out", out, "--min-rounds", "2",
                       "--max-rounds", "2", "--runs", "1").returncode == 0
    md = tmp_path / "R.md"
    r = subprocess.run([sys.executable, str(GPU / "report.py"), str(out), "--md", str(md)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    text = md.read_text()
    assert "![speedups](s.png)" in text and "Against the issue's targets" in text and "1.32x" in text
    assert "| 1.245x |" in text  # (TENSAT's own figure as a speedup, beside the reading of it)
    assert (tmp_path / "s.png").stat().st_size > 1000
    assert "| taso: analytic:t4 | taso: analytic:h100 | taso: cuda:h100 | taso: cuda:h200 |" in text
    row = next(ln for ln in text.splitlines() if ln.startswith("| SqueezeNet | ok |"))
    assert row.count("same graph as analytic:t4") == 3  # analytic:h100, cuda:h100 and cuda:h200: one file
    row = next(ln for ln in text.splitlines() if ln.startswith("| NasRNN | ok | 2 + 2 |"))
    # analytic:h100's is analytic:t4's graph, cuda:h200's cuda:h100's; cuda:h100 its own ratio
    assert row.count("same graph as") == 2 and "same graph as cuda:h100" in row
    res = json.loads(out.read_text())
    ser = RP.series(res)
    assert [lab for lab, _ in ser] == ["taso executor, optimized for analytic:t4",
                                       "taso executor, optimized for analytic:h100",
                                       "taso executor, optimized for cuda:h100",
                                       "taso executor, optimized for cuda:h200"]
    names = [m["name"] for m in res["models"]]
    sq, nr = names.index("squeezenet"), names.index("nasrnn")
    assert ser[2][1][sq][4] and not ser[2][1][nr][4]  # faint where the graph is analytic:t4's
    assert ser[1][1][nr][4] and not ser[0][1][nr][4] and ser[3][1][nr][4]
    assert ser[2][1][nr][0] == pytest.approx(res["models"][nr]["speedup"]["taso"]["opt-cuda-h100"]["median"])
    tt = RP.target_table(res)
    assert all((", analytic:" in ln or ", cuda:h100" in ln) for ln in tt.splitlines() if ln.startswith("| Nas")
               or ln.startswith("| Squ"))


def test_report_reads_the_committed_h200_results(tmp_path):
    """The H200 run's results (before the measured tables' graphs existed) still make the report: analytic:t4
    first, analytic:h100 beside it, its cells naming the graphs the two searches shared."""
    md = _committed_report(tmp_path, RUNS[2:])
    text = md.read_text()
    assert "| taso: analytic:t4 | torch: analytic:t4 | taso: analytic:h100 | torch: analytic:h100 |" in text
    row = next(ln for ln in text.splitlines() if ln.startswith("| SqueezeNet | ok | 31 |"))
    assert "1.320x (1.319-1.320)" in row and row.count("same graph as analytic:t4") == 2
    row = next(ln for ln in text.splitlines() if ln.startswith("| Inception-v3 | ok | 31 |"))
    assert "same graph" not in row and "1.302x (1.301-1.303)" in row
    assert "| Inception-v3 | 1.11x | 1.100x | 1.302x (1.301-1.303), analytic:h100 (issue: met; TENSAT: met) |" in text
    assert "## The same files in two runs" not in text  # (one run)


def test_the_report_compares_the_files_two_runs_on_one_gpu_share():
    """report.across_runs: a file timed in two runs on the same GPU gets one row with each run's ratio and the
    spread; the original's latency too; a file whose digests differ, a run on another GPU, and a page of one run
    get nothing."""
    import report as RP

    def run(gpu, orig_ms, ratio, digest="d1"):
        return {"device": {"gpu": gpu}, "date": "t", "method": {"executors": {"taso": ""}},
                "models": [{"name": "m", "variants": {"original": "o.onnx", "opt-x": "a.onnx", "opt-y": "b.onnx"},
                            "files": {"a.onnx": {"digest": digest}, "b.onnx": {"digest": "d2"}},
                            "timing": {"taso": {"o.onnx": {"median_ms": orig_ms}}},
                            "speedup": {"taso": {"opt-x": {"median": ratio, "rounds": 3},
                                                 "opt-y": {"median": 1.0, "rounds": 0}}}}]}

    text = RP.across_runs([run("G", 2.0, 1.2), run("H", 9.0, 9.0), run("G", 2.1, 1.5)])
    rows = [ln for ln in text.splitlines() if ln.startswith("| m |")]
    assert rows == ["| m | taso | o.onnx (latency) | 2 ms | 2.1 ms | 5.0% |", "| m | taso | a.onnx | 1.200x | 1.500x | 25.0% |"]
    assert "### G" in text and "### H" not in text and "run 1 (G, t) | run 3 (G, t)" in text
    assert "a.onnx" not in RP.across_runs([run("G", 2.0, 1.2), run("G", 2.1, 1.5, digest="other")])
    assert RP.across_runs([run("G", 2.0, 1.2)]) == ""


def test_the_report_reprices_the_fidelity_from_the_manifest_and_keeps_the_measurements():
    """report.reprice: each fidelity row's predictions from the manifest as it is now (the table column from its
    ops and the run's table), the measured latency the run's; a file whose plan on the GPU is not the one the
    manifest priced keeps the run's predictions and is named; the paragraph says what changed."""
    import report as RP

    plan = {"steps": 2, "fused_activations": 1, "folded_nodes": 0}
    res = {"manifest": {"set": "full", "commit": "abc", "cost_models": ["analytic:t4"]},
           "models": [{"name": "m", "files": {"a.onnx": {"plan": plan}, "b.onnx": {"plan": dict(plan, steps=3)}},
                       "fidelity": {f: {"predicted_ms": {"analytic:t4": 3.0}, "measured_ms": 2.0,
                                        "table": {"ms": 2.4, "measured_ops": 3, "estimated_ops": 0}}
                                    for f in ("a.onnx", "b.onnx")}}]}
    ops = [["k1", "conv2d", 1, {"analytic:h100": 0.5}], ["k2", "pool", 1, {"analytic:h100": 0.25}]]
    fe = {"predicted": {"total_ms": {"analytic:t4": 2.5, "cuda:h200": 2.1}, "ops": ops,
                        "as_run": {"kernels": 2, "fused": 1, "folded": 0, "priced_ops": 2}}}
    man = {"cost_models": ["analytic:t4", "cuda:h200"], "priced": {"how": "as run", "commit": "def"},
           "models": [{"name": "m", "files": {"a.onnx": fe, "b.onnx": fe}}]}
    table = {"entries": {"k1": {"ms": 1.5}}, "summary": {"name": "h200", "date": "d"}}
    note = RP.reprice(res, man, table, str(ROOT / "benchmarks" / "gpu" / "models" / "full" / "manifest.json"))
    a, b = (res["models"][0]["fidelity"][f] for f in ("a.onnx", "b.onnx"))
    assert a["predicted_ms"] == {"analytic:t4": 2.5, "cuda:h200": 2.1} and a["measured_ms"] == 2.0
    assert a["table"] == {"ms": 1.75, "measured_ops": 1, "estimated_ops": 1}
    assert b["predicted_ms"] == {"analytic:t4": 3.0} and b["table"]["ms"] == 2.4  # (planned otherwise: as recorded)
    assert res["manifest"]["cost_models"] == ["analytic:t4", "cuda:h200"]  # the manifest's new column
    assert "1 of the 1 files" in note and "commit def" in note and "commit abc" in note and "b.onnx" in note
    assert "now 0.88-0.88 (0 of 1 within 10%), was 1.20-1.20 (0 of 1 within 10%)" in note
    # a run priced as the manifest prices it (e.g. one after this manifest): nothing to say
    res2 = {"manifest": {"cost_models": ["analytic:t4", "cuda:h200"]},
            "models": [{"name": "m", "files": {"a.onnx": {"plan": plan}}, "fidelity": {"a.onnx": {
                "predicted_ms": {"analytic:t4": 2.5, "cuda:h200": 2.1}, "measured_ms": 2.0,
                "table": {"ms": 1.75, "measured_ops": 1, "estimated_ops": 1}}}}]}
    assert RP.reprice(res2, man, table, "m.json") == ""


def test_the_committed_results_page_is_the_report_of_the_committed_run_and_manifest(tmp_path):
    """benchmarks/RESULTS-gpu.md is what report.py makes of the committed runs' results with the committed manifest's
    predictions (re-priced as the executor runs each file): regenerating it changes nothing but the chart's
    path."""
    md = _committed_report(tmp_path)
    got = md.read_text()
    for p in RUNS:
        got = got.replace(f"![speedups]({p.stem}.png)", f"![speedups](results/gpu/{p.stem}.png)")
    assert got == (ROOT / "benchmarks" / "RESULTS-gpu.md").read_text()
    man = {m["name"]: m for m in manifest("full")["models"]}
    f = "squeezenet.opt-analytic-t4.onnx"
    row = [ln for ln in got.splitlines() if ln.startswith(f"| squeezenet | {f} |")][-1]  # (the fidelity's)
    assert f"{man['squeezenet']['files'][f]['predicted']['total_ms']['analytic:t4']:.4g} (" in row
    assert "**Predictions re-priced**" in got


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None, reason="needs bash and timeout")
def test_prepared_command_rehearses_end_to_end(tmp_path):
    """run_speedup.sh --dry-run with small budgets and the quick set as the main set: the environment log, the
    smoke and main results and logs, the markdown, exit 0."""
    out = tmp_path / "out"
    env = dict(os.environ, PYTHON=sys.executable, OUT=str(out), SMOKE_S="15", BUDGET_S="15", SET="quick")
    r = subprocess.run(["bash", str(GPU / "run_speedup.sh"), "--dry-run"], cwd=ROOT, capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["RESULTS-gpu.md", "env-speedup.log", "speedup-smoke.json",
                                                     "speedup-smoke.log", "speedup-smoke.md", "speedup.json",
                                                     "speedup.log"]
    res = json.loads((out / "speedup.json").read_text())
    assert res["models"] and res["elapsed_s"] < 15 + 30  # (a file being loaded when the budget ends finishes)
    assert all(m["status"] in ("ok", "partial") for m in res["models"])
    assert res["method"]["later"] == ["cuda:"] and res["passes"]["later_files"] > 0
    assert "smoke exit 0, speedups exit 0" in (out / "speedup.log").read_text()
    # VARIANTS=cuda:h200: the measured table's graphs alone beside the originals, smoke and main run
    out2 = tmp_path / "out2"
    env.update(OUT=str(out2), VARIANTS="cuda:h200", SMOKE_S="5", BUDGET_S="10")
    r = subprocess.run(["bash", str(GPU / "run_speedup.sh"), "--dry-run"], cwd=ROOT, capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for name in ("speedup-smoke.json", "speedup.json"):
        res = json.loads((out2 / name).read_text())
        assert res["method"]["variants"] == ["opt-cuda-h200"], name
        assert all(set(m["variants"]) == {"original", "opt-cuda-h200"} for m in res["models"])
    assert "variants cuda:h200" in (out2 / "env-speedup.log").read_text()


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None or shutil.which("tar") is None,
                    reason="needs bash, timeout and tar")
def test_run_all_leaves_at_most_eight_files_in_out(tmp_path):
    """run_all.sh --dry-run: the device tool brings back at most 8 files from $OUT (it dropped speedup.json on the
    first GPU check, 13 files sorted by name): the table, speedup.json, RESULTS-gpu.md, run_all.log and the other
    logs packed in logs.tgz."""
    import tarfile

    out = tmp_path / "out"
    env = dict(os.environ, PYTHON=sys.executable, OUT=str(out), CAL_SMOKE_S="5", CAL_BUDGET_S="5", SMOKE_S="5",
               BUDGET_S="5", SET="quick", TMPDIR=str(tmp_path))
    r = subprocess.run(["bash", str(GPU / "run_all.sh"), "--dry-run"], cwd=ROOT, capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["RESULTS-gpu.md", "dry.json", "logs.tgz", "run_all.log",
                                                     "speedup.json"]
    with tarfile.open(out / "logs.tgz") as t:
        names = {os.path.basename(n) for n in t.getnames()}
    assert {"env.log", "smoke.log", "calibrate.log", "speedup.log", "speedup-smoke.json"} <= names
    assert "calibration exit 0, speedups exit 0" in (out / "run_all.log").read_text()
    assert not list(tmp_path.glob("taso-gpu-logs.*"))  # (the scratch folder removed)


# ---------------------------------------------------------------------------------------------------------
# the CUDA paths


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason=NO_TORCH)
def test_torch_interpreter_on_the_cpu_matches_onnxruntime():
    for p in ("quick/nasrnn.original.onnx", "quick/squeezenet.opt-analytic-t4.onnx", "quick/bert-b1.original.onnx"):
        m = E.load_model(str(MODELS / p))
        feeds = E.random_feeds(m)
        r = TE.TorchRunner(m, feeds, device="cpu")
        c = E.check(r, E.ort_outputs(m, feeds))
        assert c["ok"], (p, c)


@pytest.mark.skipif(not _gpu(), reason=NO_GPU)
def test_cuda_speedup_smoke_on_a_gpu(tmp_path):
    out = tmp_path / "s.json"
    r = subprocess.run([sys.executable, str(GPU / "speedup.py"), "--set", "quick", "--out", str(out),
                        "--budget-s", "60"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(out.read_text())
    assert res["method"]["backend"] == "cuda" and all(m["status"] == "ok" for m in res["models"])


def _taso_bench(*args, cwd):
    return subprocess.run([sys.executable, "-m", "taso_mlir.tools.taso_bench", *args], capture_output=True,
                          text=True, timeout=600, cwd=cwd)


@pytest.mark.skipif(_gpu(), reason="a CUDA GPU is here: the GPU test above runs the whole path")
def test_taso_bench_device_cuda_prepares_then_says_in_one_line_that_no_gpu_can_run(tmp_path):
    """taso-bench --device cuda prepares the models here (optimized, checked, a manifest), then the GPU
    step ends in one line and exit 1 where no executor can start."""
    r = _taso_bench("--device", "cuda", "--quick", "--models", "squeezenet", "--out", "o", cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("taso-bench: error: --device cuda: speedup failed (exit 2): ") and "no executor" in last
    assert "Traceback" not in r.stderr
    man = json.loads((tmp_path / "o" / "gpu-models" / "quick" / "manifest.json").read_text())
    assert [m["name"] for m in man["models"]] == ["squeezenet"], man
    r = _taso_bench("--device", "cuda", "--strategies", cwd=tmp_path)
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "--device cuda" in r.stderr, r.stderr


def test_the_in_graph_comparison_is_the_report_of_the_committed_in_graph_run(tmp_path):
    """benchmarks/results/gpu/ingraph.md is what ingraph.py makes of the committed in-graph calibration and its
    whole-model run; the per-kernel overhead it finds is the alone-minus-graph difference of the small ops; a file
    that is missing or not of its kind is a one-line error."""
    r = subprocess.run([sys.executable, str(GPU / "ingraph.py"), str(RES / "h100-graph.json"),
                        str(RES / "speedup-ingraph.json")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout == (RES / "ingraph.md").read_text()
    assert "Per-kernel overhead of timing alone (the median over the ops under 0.01 ms): 2.72 us." in r.stdout
    assert "L2 flushed less the overhead / measured |" in r.stdout
    for args in ((tmp_path / "none.json", RES / "speedup-ingraph.json"), (RES / "speedup-ingraph.json",
                 RES / "speedup-ingraph.json"), (RES / "h100-graph.json", RES / "h100-graph.json")):
        r = subprocess.run([sys.executable, str(GPU / "ingraph.py"), *map(str, args)], capture_output=True,
                           text=True, timeout=60)  # (a missing file, a results file as the table, the reverse)
        assert r.returncode == 2 and r.stderr.startswith("ingraph: error: ") and "Traceback" not in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
    t = json.loads((RES / "h100-graph.json").read_text())
    assert t["method"]["in_graph"]["copies_at_most"] == 16 and t["method"]["cold"]["runs"] == 16
    assert all(e["graph_ms"] > 0 and e["cold_ms"] > 0 for e in t["entries"].values() if e["ms"] > 0)


def test_in_graph_timing_is_rehearsed_on_the_dry_backend(tmp_path):
    """calibrate.py --in-graph and --cold on the dry backend: each entry but views gets graph_ms and its copies
    (2-16, about 0.5 ms of work) and cold_ms, and the table's method says how it was timed."""
    out = tmp_path / "t.json"
    assert CAL.main(["--dry-run", "--limit", "6", "--in-graph", "4", "--cold", "3", "--cold-weights", "2",
                     "--out", str(out)]) == 0
    t = json.loads(out.read_text())
    es = [e for e in t["entries"].values() if e["ms"] > 0]
    assert es and all(e["graph_ms"] > 0 and 2 <= e["graph_copies"] <= 4 and e["graph_replays"] == 8 for e in es)
    assert all(e["cold_ms"] > 0 and e["cold_repeats"] == 3 and e["coldw_ms"] > 0 and e["coldw_repeats"] == 2 for e in es)
    assert t["method"]["in_graph"]["copies_at_most"] == 4 and t["method"]["cold"]["runs"] == 3
    assert t["method"]["cold_weights"]["runs"] == 2
    assert CAL.main(["--dry-run", "--limit", "2", "--in-graph", "0", "--out", str(out)]) == 0
    t = json.loads(out.read_text())  # (neither asked: neither timed nor named)
    assert t["method"]["in_graph"] is None and t["method"]["cold"] is None and t["method"]["cold_weights"] is None
    assert not any("graph_ms" in e or "cold_ms" in e or "coldw_ms" in e for e in t["entries"].values())
    assert CAL.K.graph_copies(1e-3, 16) == 16 and CAL.K.graph_copies(0.1, 16) == 5 and CAL.K.graph_copies(5, 16) == 2


def test_the_activations_of_a_signature_are_its_operands_that_are_not_weights():
    """What ``time_cold(warm_activations=True)`` reads back into the L2: the operands whose weight flag is 0
    (a convolution's input, not its kernel or bias); a signature without flags has only activations."""
    rec = {"in_shapes": [[1, 3, 8, 8], [4, 3, 3, 3], [4]], "weights": [0, 1, 1]}
    assert CAL.K.activation_operands(rec) == [0]
    assert CAL.K.activation_operands({"in_shapes": [[2, 2], [2, 2]]}) == [0, 1]


def test_ingraph_prices_a_file_by_its_weights_footprint(tmp_path):
    """ingraph.py with a table that has ``coldw_ms`` (calibrate.py --cold-weights): the columns of weights from
    DRAM, with and without the overhead, and by footprint, which takes the first for a file whose weights
    outgrow the L2 (--l2-mb) and the ops timed alone less the overhead for the others (SqueezeNet's 4.7 MB)."""
    sys.path.insert(0, str(GPU))
    import ingraph as IG

    t = json.loads((RES / "h100-graph.json").read_text())
    for e in t["entries"].values():
        if e["ms"] > 0:
            e["coldw_ms"] = 2 * e["ms"]
    table = tmp_path / "t.json"
    table.write_text(json.dumps(t))
    r = subprocess.run([sys.executable, str(GPU / "ingraph.py"), str(table), str(RES / "speedup-ingraph.json"),
                        "--l2-mb", "50"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    head = next(ln for ln in r.stdout.splitlines() if ln.startswith("| file |"))
    cols = [c.strip() for c in head.strip("|").split("|")]
    at = {c: i for i, c in enumerate(cols)}
    rows = {ln.split("|")[1].strip(): [c.strip() for c in ln.strip("|").split("|")]
            for ln in r.stdout.splitlines() if ln.startswith("| ") and ".onnx" in ln}
    fp = "by footprint (weights over 50 MB from DRAM) less the overhead / measured"
    man = json.loads((GPU / "models" / "full" / "manifest.json").read_text())
    ops = {f: d["predicted"]["ops"] for m in man["models"] for f, d in (m.get("files") or {}).items()
           if (d.get("predicted") or {}).get("ops")}
    assert IG.weight_bytes(ops["squeezenet.original.onnx"]) < 50 * 2 ** 20 < IG.weight_bytes(ops["resnet50.original.onnx"])
    big = small = 0
    for f, row in rows.items():
        over = IG.weight_bytes(ops[f]) > 50 * 2 ** 20
        want = "weights from DRAM less the overhead / measured" if over else "alone less the overhead / measured"
        assert row[at[fp]] == row[at[want]], f
        big, small = big + over, small + (not over)
        assert float(row[at["weights from DRAM / measured"]]) == pytest.approx(2 * float(row[at["alone / measured"]]), abs=0.011)
    assert big and small
