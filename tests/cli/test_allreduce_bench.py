"""`mldebug allreduce-bench` on real gloo ranks: 2 and 3 ranks, self-launched and under torchrun. The
pairwise mode on 4 ranks under torchrun with a transient and a persistent slow link; on 4 ranks and across
self-launched nodes, the slow-link drills' evidence (tests/cli/test_drill.py).

Small sizes and few iterations keep each run to seconds; the numbers are checked against the
definitions (from the JSON), never against a speed.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import psutil
import pytest

from ml_debug.bench import bandwidth as bw
from tests.conftest import REPO, require, reserved_port
from tests.fakes import faults

SCHEMA = json.loads((REPO / "ml_debug" / "schemas" / "allreduce-bench.json").read_text())
MLDEBUG_EXE = Path(sys.executable).parent / "mldebug"
# gloo keeps fixed rank counts on CPU tensors on any machine (4 ranks cannot share one GPU with NCCL)
SMALL = ["-b", "1K", "-e", "16K", "-f", "4", "-n", "3", "-w", "1", "--collective-timeout", "60", "--backend", "gloo"]
ENV = {"OMP_NUM_THREADS": "1", "MLDEBUG_WIDTH": "160"}


def _validate(doc: dict[str, Any]) -> None:
    jsonschema.validate(doc, SCHEMA)
    assert doc["schema"] == "mldebug.allreduce-bench" and doc["schema_version"] == 1


def _run(argv: list[str], env: dict[str, str] | None = None, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """Run a launcher; on timeout stop it and every rank it started, by pid, and fail."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **ENV, **(env or {})}, cwd=REPO)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_tree(proc.pid)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(argv[:6])} ... did not finish in {timeout} s:\n{err[-3000:]}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _run_torchrun(nproc: int, args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """torchrun --standalone --nproc-per-node N --no-python mldebug ..."""
    require(MLDEBUG_EXE.exists(), f"the mldebug console script at {MLDEBUG_EXE}")
    return _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
                 "--no-python", str(MLDEBUG_EXE), *args], env)


def _self_launch(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`mldebug allreduce-bench ...` starting its own ranks."""
    return _run([sys.executable, "-m", "ml_debug", "allreduce-bench", *args], env)


def _kill_tree(pid: int) -> None:
    # torchrun's workers live in their own sessions: stop each one by pid.
    try:
        parent = psutil.Process(pid)
        for child in parent.children(recursive=True):
            child.kill()
        parent.kill()
    except psutil.NoSuchProcess:
        pass


def _json(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.stdout.strip(), f"no JSON on stdout (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
    doc = json.loads(proc.stdout)  # exactly one document, nothing before or after it
    _validate(doc)
    return doc


def _check_definitions(result: dict[str, Any], n: int, elem: int) -> None:
    """busbw/algbw follow nccl-tests' definitions exactly, and #wrong is 0 everywhere."""
    assert result["world_size"] == n
    for c in result["collectives"]:
        assert c["error"] is None, c
        assert c["bus_factor"] == pytest.approx(bw.bus_factor(c["collective"], n))
        assert c["sizes"], c["collective"]
        for s in c["sizes"]:
            assert s["wrong"] == 0 and s["wrong_by_rank"] == {}, (c["collective"], s)
            assert len(s["rank_time_us"]) == n
            assert s["time_us"] == pytest.approx(sum(s["rank_time_us"]) / n)  # nccl-tests' default -a 1
            assert s["max_time_us"] == pytest.approx(max(s["rank_time_us"]))
            assert s["algbw"] == pytest.approx(s["size"] / (s["time_us"] * 1e-6) / 1e9)
            assert s["busbw"] == pytest.approx(s["algbw"] * bw.bus_factor(c["collective"], n))
            lay = bw.layout(c["collective"], s["size"], elem, n)
            assert (s["size"], s["count"]) == (lay.size_bytes, lay.count)
        large = [s["busbw"] for s in c["sizes"] if s["size"] >= c["large_from"]]
        assert c["avg_busbw_large"] == pytest.approx(sum(large) / len(large))
        assert c["peak_busbw"] == pytest.approx(max(s["busbw"] for s in c["sizes"]))


def _default_world() -> tuple[int, list[int]]:
    """Ranks of a default self-launch here and the --quick sizes they use."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.device_count(), [2**20, 16 * 2**20, 256 * 2**20]
    return 2, [256 * 1024, 2**20, 4 * 2**20]


def test_self_launched_two_ranks_quick_every_collective_csv_and_plot(tmp_path: Path) -> None:
    # --quick --json is what `mldebug check` runs; here with every collective, CSV and the plot.
    csv_path, png = tmp_path / "rows.csv", tmp_path / "busbw.png"
    proc = _self_launch(["--quick", "--collective", "all", "--json", "--csv", str(csv_path), "--plot", str(png),
                         "--straggler-threshold", "1000"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = _json(proc)["result"]
    assert result["ok"] is True and result["summary"].startswith("OK") and result["quick"]
    assert result["iters"] == 5 and result["warmup"] == 2
    assert [c["collective"] for c in result["collectives"]] == list(bw.COLLECTIVES)
    # documented --quick sweeps: 256K..4M x4 on CPU, 1M..256M x16 on GPU; one rank per GPU, else 2
    n, sizes = _default_world()
    assert [s["size"] for s in result["collectives"][0]["sizes"]] == sizes
    _check_definitions(result, n, elem=4)
    rows = csv_path.read_text().splitlines()
    assert rows[0].startswith("collective,size,count,type,redop")
    assert len(rows) == 1 + sum(len(c["sizes"]) for c in result["collectives"])
    import matplotlib.image

    img = matplotlib.image.imread(str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and img.shape[0] > 100 and img.shape[1] > 100


def test_torchrun_three_ranks_every_collective_after_double_dash() -> None:
    # `--` keeps torchrun's parser off the worker's options (FIELD-NOTES: "ambiguous option").
    # 3 ranks on 2 shared cores with 3 iterations: timing noise alone can look like a straggler, and
    # stragglers are the fault test's subject, so this run only asks for a very slow one.
    proc = _run_torchrun(3, ["allreduce-bench", "--", "--collective", "all", "-o", "max", "-d", "bf16", *SMALL,
                             "--straggler-threshold", "1000", "--json"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = _json(proc)["result"]
    assert result["ok"], result["summary"]
    assert len(result["collectives"]) == len(bw.COLLECTIVES) and len(result["ranks"]) == 3
    assert result["dtype"] == "bfloat16" and result["collectives"][0]["op"] == "max"
    assert result["collectives"][1]["op"] is None  # all_gather has no reduction
    _check_definitions(result, 3, elem=2)  # 3 ranks: busbw differs from algbw, and counts round down


def test_faults_corrupt_and_straggler_are_named_in_every_collective(tmp_path: Path) -> None:
    # Root 1 so that reduce (checked on its root only) sees the corrupted rank too.
    # A 100x straggler: its sizes take ~100 us, and a descheduled rank on a loaded 2-core machine was seen at
    # several ms (a 10x straggler went unnamed in one size of two, once in CI).
    # --plot keeps rank 0 busy after rank 1 has its (failing) verdict: torchrun stops every rank as
    # soon as one exits non-zero, so rank 1 must not leave before rank 0 printed the verdict.
    spec = "allreduce-bench.corrupt:rank=1,count=4;allreduce-bench.slow:rank=1,factor=100"
    env = faults.env(spec)
    png = tmp_path / "busbw.png"
    proc = _run_torchrun(2, ["allreduce-bench", "-C", "all", "-r", "1", *SMALL, "--expect-busbw", "1e6", "--json",
                             "--plot", str(png)], env=env)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert png.stat().st_size > 0
    result = _json(proc)["result"]
    assert not result["ok"] and result["test_faults"] == spec
    assert f"TEST-ONLY hooks active (MLDEBUG_TEST_HOOKS=tests.fakes.faults): {spec}" in result["notes"]
    assert result["summary"].endswith("[TEST-ONLY fault hook active]")
    assert len(result["collectives"]) == len(bw.COLLECTIVES)
    for c in result["collectives"]:
        assert [s["wrong_by_rank"] for s in c["sizes"]] == [{"1": 4}] * len(c["sizes"]), c["collective"]
        assert c["wrong_total"] == 4 * len(c["sizes"])
        assert c["straggler"]["rank"] == 1 and c["straggler"]["times_slower"] > 3, c["collective"]
        assert c["expect_ok"] is False
    assert "wrong element(s) on rank(s) 1" in result["summary"] and "rank 1" in result["summary"]
    assert "below the expected 1e+06 GB/s" in result["summary"]


# The drill's pairwise run (ml_debug/drill/sites.py): 256K exchanges, 5 iterations, a floor at 30% of the median.
PAIRWISE = ["allreduce-bench", "--pairwise", "--backend", "gloo", "--device", "cpu", "-e", "256K", "-n", "5", "-w", "1",
            "--slow-threshold", "0.7", "--collective-timeout", "60", "--json"]


@pytest.mark.parametrize(("spec", "slow"), [
    # 2<->3 20x slow in the first measurement only: a transient, as CPU contention once was on CI
    ("allreduce-bench.slow-pair:pair=2-3,factor=20,remeasures=0", []),
    # 1<->3 50x slow whenever it is measured, beside the same transient (a transient that lasts into the
    # re-measurements: tests/unit/bench/test_bandwidth.py; timing on 2 shared cores is too noisy to count on
    # one particular later re-measurement here). 50x, not 20x: the other tests' ranks on 2 shared cores can drag
    # the first pass's median, and the floor with it, down several-fold; a 20x link re-measured in a calm moment
    # once stood above that floor in CI
    ("allreduce-bench.slow-pair:pair=1-3,factor=50;allreduce-bench.slow-pair:pair=2-3,factor=20,remeasures=0",
     [(1, 3)]),
])
def test_pairwise_names_a_link_only_when_measuring_it_again_confirms_it(spec: str, slow: list[tuple[int, int]]) -> None:
    proc = _run_torchrun(4, PAIRWISE, env=faults.env(spec))
    result = _json(proc)["result"]
    pairs = result["pairwise"]
    named = [(x["a"], x["b"]) for x in pairs["slow_links"]]
    # The injected links are named and the transient is not. A pair that was not injected may be named too: the
    # other tests' ranks on these 2 shared cores can slow a rank for seconds (CI saw 0<->3 at a quarter of the
    # median in all four of its measurements); the checks below hold it to the same rule.
    assert set(slow) <= set(named) and (2, 3) not in named, (named, {k: pairs[k] for k in (
        "median", "threshold", "matrix", "remeasured", "slow_units") if k in pairs}, proc.stderr[-3000:])
    assert proc.returncode == (1 if named else 0), proc.stdout[-3000:] + proc.stderr[-3000:]
    assert result["mode"] == "pairwise" and result["test_faults"] == spec
    assert (pairs["units"], pairs["rounds"], pairs["passes"], pairs["remeasures"]) == ("rank", 3, 3, 3)
    # No rank is slow as a whole. In a world of 4 a rank's score is its middle link of three, so a rank with a
    # named link and a second one that contention dragged down may be named (CI saw rank 1, of the 50x link 1<->3):
    # only a rank of a named link may be
    touching = {pairs["names"][u] for pair in named for u in pair}
    assert set(pairs["slow_units"]) <= touching, (pairs["slow_units"], named, pairs["matrix"])
    again = {(r["a"], r["b"]): r for r in pairs["remeasured"]}
    # the transient was below the floor in the first measurement (20x slow in every pass), measured again
    # until a re-measurement no longer saw it (the first, unless the node's noise took that one too), and
    # cleared: the matrix keeps its best figure
    transient = again[(2, 3)]
    assert transient["slow"] is False and transient["again"], transient
    # each link's floor: the median of the other links (in the final matrix), less the threshold
    floor = {p: m * (1 - pairs["threshold"]) for p, m in bw.find_slow(pairs["matrix"], pairs["threshold"]).others.items()}
    assert transient["first"] < floor[(2, 3)] <= transient["again"][-1] == pairs["matrix"][2][3] == pairs["matrix"][3][2]
    # every pair measured again and still below the floor is a named link, and every named link was
    assert sorted(p for p, r in again.items() if r["slow"]) == sorted(named)
    for a, b in named:
        link = again[(a, b)]
        # as often as the time bound allowed (3 times unless re-measuring took twice as long as the passes)
        assert 1 <= len(link["again"]) <= 3 and max(link["first"], *link["again"]) == pairs["matrix"][a][b] < floor[(a, b)]
    words = (f"{len(pairs['remeasured'])} pair(s) below the floor re-measured" if not named
             else "more pair(s) below the floor at first, cleared when re-measured")
    assert words in result["summary"], result["summary"]


@pytest.mark.parametrize(("args", "message"), [
    (["-b", "10X"], "bad --min-bytes '10X'"),
    (["-b", "1M", "-e", "1K"], "larger than max"),
    (["-d", "float7"], "unknown dtype"),
    (["-o", "xor"], "unknown reduction op"),
    (["-C", "gossip"], "unknown collective"),
    (["-f", "1"], "step factor"),
    (["--op", "avg", "-d", "int32"], "floating-point"),
    (["extra"], "unexpected extra argument"),
    # Paths and rank counts are checked before any rank starts, not after the sweep.
    (["--csv", "/nonexistent/x.csv"], "--csv /nonexistent/x.csv: directory /nonexistent does not exist"),
    (["--csv", "/"], "--csv / is a directory"),
    (["--csv", "x" * 300], "File name too long"),
    (["--plot", "/nonexistent/x.png"], "--plot /nonexistent/x.png: directory /nonexistent does not exist"),
    (["--pairwise", "--nproc-per-node", "1"], "--pairwise measures pairs of ranks, and this run has 1"),
    (["--root", "2", "--nproc-per-node", "2"], "--root 2 is outside the 2 ranks"),
])
def test_bad_options_exit_2_with_one_line(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    # In-process: options are checked before any rank starts or torch is imported.
    from ml_debug.cli.app import run

    assert run(["allreduce-bench", *args]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert lines[0].startswith("mldebug: error: ") and message in lines[0]
    assert len(lines) == 2 and lines[1].startswith("hint: ")
    assert out == ""


def test_a_file_that_fails_to_write_at_the_end_loses_no_result(tmp_path: Path) -> None:
    # One rank under a launcher's environment (no multi-rank job). The CSV's name passes the up-front check
    # and its write fails at the end, as on a disk that filled during the run: the process may write no
    # file bigger than 0 bytes (RLIMIT_FSIZE; Python ignores SIGXFSZ, so the write fails with EFBIG).
    import resource

    csv_path = tmp_path / "bench.csv"
    with reserved_port() as port:
        env = {**os.environ, **ENV, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "PYTHONDONTWRITEBYTECODE": "1"}
        proc = subprocess.run([sys.executable, "-m", "ml_debug", "--json", "allreduce-bench", "-b", "1K", "-e", "2K",
                               "-n", "1", "-w", "0", "--csv", str(csv_path)], capture_output=True, text=True,
                              timeout=120, env=env, cwd=REPO,
                              preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0)))
    assert proc.returncode == 4, proc.stderr
    assert _json(proc)["result"]["ok"] is True
    assert f"mldebug: error: the result above is complete, but {csv_path} could not be written" in proc.stderr


def test_a_device_is_never_replaced_by_an_output_file() -> None:
    """`--csv /dev/null` as root once replaced the system's /dev/null with a regular file (a planted link is
    replaced by the real file; a device is no planted link): refused up front, the device left as it is."""
    from ml_debug.cli.app import run

    before = os.stat("/dev/null")
    assert run(["allreduce-bench", "--csv", "/dev/null"]) == 2
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and (after.st_ino, after.st_rdev) == (before.st_ino, before.st_rdev)
