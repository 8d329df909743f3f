"""taso-verify --cluster ray (verifier.distributed) on a local Ray runtime of 2 CPUs: a slice of the shipped
library verified on Ray writes the file the local run writes (the times, the job count and the proofs'
axiom lists aside: see ``_normalized``); a rule whose task hangs gets prove_many's killed/unknown result,
every other rule its own, and the restarted worker proves on; a worker that keeps dying is a one-line
error; so are a bad or unreachable --cluster and a missing Ray."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'taso-mlir[distributed]')")

from taso_mlir.generator import graph as G  # noqa: E402
from taso_mlir.generator import library  # noqa: E402
from taso_mlir.generator.distributed import DistributedError  # noqa: E402
from taso_mlir.tools import taso_verify  # noqa: E402
from taso_mlir.verifier import distributed as D  # noqa: E402
from taso_mlir.verifier.prove import prove_many  # noqa: E402

#: 40 rules of the shipped library that prove in well under a second each (matmuls, convolutions, pools:
#: some are tried with a symbolic stride), so no proof is near its timeout
SLICE = slice(120, 160)


def _slice(tmp_path):
    header, records = library.read(library.default_path("base"))
    path = tmp_path / "slice.jsonl"
    library.write(path, header, records[SLICE])
    return path


def _normalized(path) -> str:
    """The file with what depends on how the run went set aside: the header's run time and job count,
    each proof's time, and each proof's axioms (Z3's unsat core, which depends on the terms the prover's
    context made for the rules proved before in that process: in prove_many with --jobs 2 too, the rules
    a process gets depend on timing). Everything else, every status, reason, generalized stride and shape
    fuzzing count included, must be the same."""
    lines = path.read_text().splitlines()
    header = json.loads(lines[0])
    header["verification"]["time_s"] = header["verification"]["jobs"] = None
    out = [json.dumps(header, sort_keys=True)]
    for line in lines[1:]:
        r = json.loads(line)
        assert (r["proof"]["status"] == "proved") == bool(r["proof"]["axioms"]), r["id"]
        r["proof"]["time_s"] = r["proof"]["axioms"] = None
        out.append(json.dumps(r, sort_keys=True))
    return "\n".join(out) + "\n"


def test_the_slice_on_ray_is_the_local_file(local_ray, tmp_path, capsys):
    src = _slice(tmp_path)
    local, on_ray = tmp_path / "local.jsonl", tmp_path / "ray.jsonl"
    assert taso_verify.main([str(src), "-o", str(local), "--jobs", "1", "--no-progress"]) == 0
    assert taso_verify.main([str(src), "-o", str(on_ray), "--cluster", "ray", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "total" in out and "with 2 Ray workers" in out and "cluster: 2 Ray workers; 0 task(s) killed" in out
    assert _normalized(on_ray) == _normalized(local)
    header = json.loads(on_ray.read_text().splitlines()[0])["verification"]
    assert header["jobs"] == 2 and header["status"] == {"proved": 40}
    assert header["shape_fuzz"]["compared"] > 1000 and header["stride_generalized"] > 0


def test_taso_gen_verify_proves_on_the_same_runtime(local_ray, tmp_path, capsys):
    """taso-gen --cluster ray --verify: the rules generated on Ray are proved there, in place, on the
    runtime the generation ran on (left up: this process started it); the statuses are a local
    taso-verify's of the same generated file."""
    from taso_mlir.tools import taso_gen
    out, plain, local = tmp_path / "r.jsonl", tmp_path / "plain.jsonl", tmp_path / "local.jsonl"
    common = ["--max-ops", "2", "--jobs", "2", "--cluster", "ray", "--shards", "3", "--buckets", "2", "--no-progress"]
    assert taso_gen.main(common + ["--verify", "-o", str(out)]) == 0
    assert ray.is_initialized()
    text = capsys.readouterr().out
    assert "cluster: 2 Ray workers" in text and "(unverified: run taso-verify)" not in text
    assert taso_gen.main(common + ["-o", str(plain)]) == 0
    assert "(unverified: run taso-verify)" in capsys.readouterr().out
    assert taso_verify.main([str(plain), "-o", str(local), "--jobs", "1", "--no-progress"]) == 0
    statuses = [json.loads(line)["proof"]["status"] for line in out.read_text().splitlines()[1:]]
    assert statuses.count("proved") >= 30
    assert statuses == [json.loads(line)["proof"]["status"] for line in local.read_text().splitlines()[1:]]


def _pairs(n):
    _header, records = library.read(library.default_path("base"))
    return [(G.Graph.from_json(r["src"]), G.Graph.from_json(r["dst"]),
             {v: len(shape) for v, (shape, _kind) in r["inputs"].items()}) for r in records[SLICE][:n]]


def _outcome(res):
    return res["status"], res["reason"]


def test_a_hanging_rule_is_killed_and_the_restarted_worker_proves_on(local_ray, tmp_path):
    """One worker, so every task after a kill runs on the restarted actor, and its restarts take 7 s, more
    than a rule's budget (2 x 0.5 + 5 s): a task's clock starts only once the actor answers, so no task
    after a kill overruns (started at the submission, the next task would)."""
    pairs = _pairs(7)
    ref = prove_many(pairs, timeout_s=0.5, jobs=1)
    seen = []
    with D.Pool(workers=1, hooks={"slow_restart": (7.0, str(tmp_path))}) as pool:
        pid = ray.get(pool.actors[0].handle.ping.remote())
        got = pool.prove_many(pairs, 0.5, progress=seen.append, hooks={"sleep": [1]}, chunk=2)
        # the first chunk (rules 0-1) overran its 2 budgets and was split; rule 1 alone overran its own
        assert pool.timeouts == 2 and pool.retried == 0
        assert got[1] == {"status": "unknown", "time_s": 0.5, "axioms": [],
                          "reason": "killed: Z3 overran the rule's time budget"}
        assert [_outcome(r) for i, r in enumerate(got) if i != 1] == [_outcome(r) for i, r in enumerate(ref) if i != 1]
        assert all(r["status"] == "proved" for i, r in enumerate(got) if i != 1)
        assert len(seen) == len(pairs) and sorted(map(id, seen)) == sorted(map(id, got))
        assert ray.get(pool.actors[0].handle.ping.remote()) != pid  # (restarted)
        again = pool.prove_many(pairs, 0.5)  # the next run on the restarted worker: every rule
        assert [_outcome(r) for r in again] == [_outcome(r) for r in ref] and pool.timeouts == 2


def test_a_worker_that_keeps_dying_is_a_one_line_error(local_ray):
    pairs = _pairs(4)
    with D.Pool(workers=2) as pool:
        with pytest.raises(DistributedError) as e:
            pool.prove_many(pairs, 0.5, hooks={"kill": [2]}, chunk=2, names=["A", "B", "C", "D"])
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith(f"proof of rule C: its Ray worker died {D.RETRIES + 1} times"), msg
        assert [r["status"] for r in pool.prove_many(pairs, 0.5)] == ["proved"] * 4  # the pool works on


def _taso_verify(*args, cwd):
    return subprocess.run([sys.executable, "-m", "taso_mlir.tools.taso_verify", *args], capture_output=True,
                          text=True, timeout=120, cwd=cwd)


@pytest.mark.parametrize("cluster,msg", [
    ("spark", "--cluster spark: give 'ray' (a local Ray runtime) or ray://HOST:PORT"),
    ("ray://127.0.0.1:1", "cannot reach the Ray cluster at ray://127.0.0.1:1"),
])
def test_cli_errors_are_one_line(tmp_path, cluster, msg):
    r = _taso_verify("--cluster", cluster, "--no-progress", "-o", str(tmp_path / "out.jsonl"), cwd=tmp_path)
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and msg in r.stderr, r.stderr
    assert r.stdout == "" and not (tmp_path / "out.jsonl").exists()


def test_without_ray_the_error_names_the_extra(tmp_path):
    code = ("import sys; sys.modules['ray'] = None\n"
            "from taso_mlir.tools.taso_verify import main\n"
            f"sys.exit(main(['--cluster', 'ray', '--no-progress', '-o', {str(tmp_path / 'out.jsonl')!r}]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "pip install 'taso-mlir[distributed]'" in r.stderr
