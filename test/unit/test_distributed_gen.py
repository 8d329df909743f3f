"""taso-gen --cluster ray (generator.distributed) on a local Ray runtime of 2 workers: the shipped N = 3
library; the same file byte for byte for any number of shards and buckets and as the single-process
generator's (header less its times and job count), whether the workers keep their shards for the
rebuild or rebuild them from the op tables; a worker killed mid-task (it restarts without the shards it
kept) and a task past its timeout are retried; a run interrupted and resumed from its checkpoint gives the same file; one-line errors."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'taso-mlir[distributed]')")

from taso_mlir.generator import distributed, library, pipeline  # noqa: E402
from taso_mlir.generator import graph as G  # noqa: E402
from taso_mlir.generator.enumerate import FAMILIES, Config  # noqa: E402
from taso_mlir.verifier.prove import generalize_strides  # noqa: E402

QUIET = dict(progress=False, log=lambda m: None)
#: a small family with every stage busy (merges, transposes, relu): seconds per run
SMALL = Config(max_ops=3, ops=("matmul", "ewadd", "relu", "transpose"), id_prefix="T")


def _text(tmp_path, name, header, records) -> bytes:
    p = tmp_path / name
    library.write(p, header, records)
    return p.read_bytes()


def _single(cfg, **kw):
    header, records = pipeline.generate(cfg, jobs=1, log=lambda m: None, **kw)
    del header["times_s"], header["jobs"]
    return header, records


def test_n3_on_ray_is_the_shipped_library(local_ray, tmp_path):
    """taso-gen then taso-verify made rules.jsonl: the records agree in every field but the proof, and
    in src/dst/text once the generated rule is stated with the symbolic stride where the shipped one is."""
    header, records, report = distributed.generate(FAMILIES["base"], shards=8, buckets=4, **QUIET)
    sh_header, shipped = library.read(library.default_path("base"))
    assert header["config"] == sh_header["config"]
    assert header["counts"] == {k: v for k, v in sh_header["counts"].items() if k != "proved"}
    assert len(records) == len(shipped) == 674
    for g, s in zip(records, shipped):
        g, s = dict(g), dict(s)
        del g["proof"], s["proof"]
        if G.has_symbolic_stride(G.Graph.from_json(s["src"]), G.Graph.from_json(s["dst"])):
            a, b = (generalize_strides(G.Graph.from_json(g[k])) for k in ("src", "dst"))
            g.update(src=a.to_json(), dst=b.to_json(), text=[a.text(), b.text()])
        assert g == s, g["id"]
    assert report["enumerate"]["graphs"] == 70712 and report["workers"] == 2


@pytest.mark.parametrize("shards,buckets", [(1, 1), (3, 2), (7, 5)])
def test_the_same_file_for_any_shards_and_buckets(local_ray, tmp_path, shards, buckets):
    ref = _text(tmp_path, "single.jsonl", *_single(SMALL))
    header, records, report = distributed.generate(SMALL, shards=shards, buckets=buckets, **QUIET)
    assert _text(tmp_path, "ray.jsonl", header, records) == ref
    assert header["counts"]["after_float_test"] > 20
    assert report["shards_rebuilt_from_table"] == 0  # the workers kept their shards


def test_shards_the_workers_do_not_keep_are_rebuilt_from_their_op_tables(local_ray, tmp_path):
    ref = _text(tmp_path, "single.jsonl", *_single(SMALL))
    header, records, report = distributed.generate(SMALL, shards=4, buckets=3, hold_mb=0, **QUIET)
    assert report["shards_rebuilt_from_table"] == 4
    assert _text(tmp_path, "ray.jsonl", header, records) == ref


def test_derivability_on_ray_is_the_single_process_one(local_ray, tmp_path):
    base = tmp_path / "n2.jsonl"
    library.write(base, *_single(dataclasses.replace(SMALL, max_ops=2)))
    ref = _text(tmp_path, "single.jsonl", *_single(SMALL, derive_from=str(base)))
    header, records, _ = distributed.generate(SMALL, shards=5, buckets=3, derive_from=str(base), **QUIET)
    assert "after_derivability" in header["counts"] and header["derived_from"]["base_max_ops"] == 2
    assert _text(tmp_path, "ray.jsonl", header, records) == ref


def test_a_killed_worker_is_retried(local_ray, tmp_path, monkeypatch):
    ref = _text(tmp_path, "single.jsonl", *_single(SMALL))
    monkeypatch.setenv("TASO_GEN_TEST_KILL", "enumerate-1,members-2")
    ck = tmp_path / "ck"
    header, records, report = distributed.generate(SMALL, shards=4, buckets=2, checkpoint=ck, **QUIET)
    assert (ck / "test-kill-enumerate-1").exists() and (ck / "test-kill-members-2").exists()
    assert report["tasks_retried"] == 2
    # the worker killed in members-2 restarted without the shards it kept: those are rebuilt from their tables
    assert report["shards_rebuilt_from_table"] >= 1
    assert _text(tmp_path, "ray.jsonl", header, records) == ref


def test_a_task_past_its_timeout_is_cancelled_and_submitted_again(local_ray, tmp_path, monkeypatch):
    ref = _text(tmp_path, "single.jsonl", *_single(SMALL))
    monkeypatch.setenv("TASO_GEN_TEST_SLEEP", "enumerate-0")
    header, records, report = distributed.generate(SMALL, shards=3, buckets=2, checkpoint=tmp_path / "ck",
                                                   task_timeout=8, **QUIET)
    assert report["tasks_timed_out"] == 1
    assert _text(tmp_path, "ray.jsonl", header, records) == ref


def test_a_checkpoint_of_other_settings_is_refused(local_ray, tmp_path):
    ck = tmp_path / "ck"
    distributed.generate(dataclasses.replace(SMALL, max_ops=2), shards=2, buckets=2, checkpoint=ck, **QUIET)
    with pytest.raises(distributed.DistributedError, match="holds a run with other settings .*shards"):
        distributed.generate(dataclasses.replace(SMALL, max_ops=2), shards=3, buckets=2, checkpoint=ck, **QUIET)


def _taso_gen(*args, **kw):
    """taso-gen with SIGINT at its default, as at a terminal, however this test was started (a shell starts
    a background job with SIGINT ignored, and a program started so keeps ignoring it)."""
    return subprocess.Popen([sys.executable, "-m", "taso_mlir.tools.taso_gen", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL), **kw)


def _stop(p):
    """Where a test ended with taso-gen still running (a failure), kill it and its local Ray runtime (its
    process group), so the tests after it do not share the machine with them."""
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(timeout=30)


def test_resume_after_an_interrupt_gives_the_same_file(tmp_path):
    """taso-gen --cluster ray is interrupted (SIGINT) while a shard hangs, then run again: it resumes from
    the checkpoint (the done tasks are not run again) and writes the file an uninterrupted run writes."""
    ck, out = tmp_path / "ck", tmp_path / "rules.jsonl"
    args = ["--max-ops", "2", "--jobs", "2", "--cluster", "ray", "--shards", "6", "--buckets", "3",
            "--checkpoint", str(ck), "--no-progress", "-o", str(out)]
    p = _taso_gen(*args, env={**os.environ, "TASO_GEN_TEST_SLEEP": "enumerate-4"})
    try:
        deadline = time.monotonic() + 120
        while len(list((ck / "enumerate").glob("*.done")) if (ck / "enumerate").exists() else []) < 5:
            assert p.poll() is None and time.monotonic() < deadline, p.communicate()
            time.sleep(0.2)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        _stop(p)
    assert p.returncode == 130 and err.strip().endswith("taso-gen: error: interrupted"), err
    assert not out.exists()
    p = _taso_gen(*args)
    try:
        stdout, err = p.communicate(timeout=120)
    finally:
        _stop(p)
    assert p.returncode == 0, err
    assert "5 tasks resumed from the checkpoint" in stdout
    assert json.loads((ck / "report.json").read_text())["tasks_resumed"] == 5
    header, records = _single(dataclasses.replace(FAMILIES["base"], max_ops=2))
    assert out.read_bytes() == _text(tmp_path, "single.jsonl", header, records)


@pytest.mark.parametrize("args,msg", [
    (["--checkpoint", "ck"], "--shards, --buckets, --checkpoint and --task-timeout need --cluster"),
    (["--cluster", "spark"], "--cluster spark: give 'ray' (a local Ray runtime) or ray://HOST:PORT"),
    (["--cluster", "ray://127.0.0.1:1"], "cannot reach the Ray cluster at ray://127.0.0.1:1"),
    (["--cluster", "ray", "--task-timeout", "0"], "--task-timeout must be positive"),
    (["--id-prefix", "a-b"], "--id-prefix 'a-b': give letters and digits"),
    (["--timeout", "5"], "--timeout needs --verify"),
    (["--verify", "--timeout", "0"], "--timeout must be positive"),
])
def test_cli_errors_are_one_line(tmp_path, args, msg):
    p = _taso_gen("--max-ops", "2", "--no-progress", "-o", str(tmp_path / "r.jsonl"), *args, cwd=tmp_path)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 1 and err.count("\n") == 1 and msg in err, err


def test_without_ray_the_error_names_the_extra(tmp_path):
    code = ("import sys; sys.modules['ray'] = None\n"
            "from taso_mlir.tools.taso_gen import main\n"
            f"sys.exit(main(['--max-ops', '2', '--cluster', 'ray', '-o', {str(tmp_path / 'r.jsonl')!r}]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "pip install 'taso-mlir[distributed]'" in r.stderr
