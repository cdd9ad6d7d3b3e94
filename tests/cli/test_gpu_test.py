"""`mldebug gpu-test` with real gloo ranks: self-launched, under torchrun, by hand (a missing rank,
a wrong layout), a killed rank, a wrong value (test-only fault hook) and --isolate. Under Slurm (srun on
2 nodes): tests/rig/test_slurm_templates.py; the default world (one rank per GPU, else 2 CPU ranks):
tests/cli/test_check.py's bench-fault test."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import psutil
import pytest

from tests.conftest import REPO, check_golden, closed_port, mldebug, require, reserved_port
from tests.fakes import faults

SCHEMA = json.loads((REPO / "ml_debug" / "schemas" / "gpu-test.json").read_text())
GOLDEN = REPO / "tests" / "golden" / "gpu_test_ok.txt"
# The fault tests name rank 1 or slot 1: two CPU ranks, the same on a machine with one GPU or eight.
TWO_CPU_RANKS = ("--device", "cpu", "--backend", "gloo", "--nproc-per-node", "2")


def _doc(stdout: str) -> dict:
    doc = json.loads(stdout)
    jsonschema.validate(doc, SCHEMA)
    return doc


def _no_process_mentions(token: str) -> None:
    deadline = time.monotonic() + 10
    while True:
        left = [p.pid for p in psutil.process_iter(["cmdline"])
                if any(token in part for part in (p.info["cmdline"] or []))]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not left, f"processes left behind: {left}"


def _hand(rank: int, world: int, port: int, *args: str, local: int | None = None,
          env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """One rank started by hand; rank 0 hosts the store on `port` (see conftest.reserved_port)."""
    full = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank if local is None else local),
            "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1", "MLDEBUG_WIDTH": "160", **(env or {})}
    # gloo on CPU tensors: ranks by hand share no GPU, on any machine
    return subprocess.Popen([sys.executable, "-m", "ml_debug", "gpu-test", "--backend", "gloo", *args], env=full, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _wait(procs: list[subprocess.Popen[str]], timeout: float) -> list[tuple[int, str, str]]:
    out = []
    for p in procs:
        try:
            so, se = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            so, se = p.communicate()
            pytest.fail(f"rank pid {p.pid} did not end within {timeout} s: {se[-2000:]}")
        out.append((p.returncode, so, se))
    return out


def test_torchrun_two_ranks(tmp_path: Path) -> None:
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    require(torchrun, "torchrun")
    mld = str(Path(sys.executable).parent / "mldebug")
    r = subprocess.run([torchrun, "--nproc-per-node", "2", "--no-python", mld, "gpu-test", "--json", "--stage-timeout", "30",
                        "--backend", "gloo"],  # 2 ranks on CPU tensors: as many GPUs are not needed
                       capture_output=True, text=True, timeout=240, cwd=tmp_path,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    res = _doc(r.stdout)["result"]
    assert res["world_size"] == 2 and res["ok"]
    assert sorted(x["identity"]["local_rank"] for x in res["ranks"]) == [0, 1]


def test_human_table_golden(tmp_path: Path) -> None:
    # SLURMD_NODENAME is the node name gpu-test reports (as under srun): a fixed width for the table.
    # Two CPU ranks on any machine (a GPU machine too): the golden pins the table, not the hardware.
    # The same passing run's JSON (rank 0 writes gpu-test.json to --out-dir in human mode too) is checked
    # below; the default world (one rank per GPU, else 2 CPU ranks) is checked by tests/cli/test_check.py's
    # bench-fault test, whose gpu-test step runs a default gpu-test.
    out = tmp_path / "gt-golden"
    r = mldebug("gpu-test", "--stage-timeout", "20", "--out-dir", str(out), *TWO_CPU_RANKS,
                env={"SLURMD_NODENAME": "golden-host"}, timeout=180)
    assert r.returncode == 0, r.stderr
    text = re.sub(r"ok \d+\.\d\d", "ok T", r.stdout)
    text = re.sub(r"torch \S+, CUDA \S+, NCCL \S+;", "torch V, CUDA V, NCCL V;", text)
    text = "\n".join(line.rstrip() for line in text.splitlines()) + "\n"
    check_golden(GOLDEN, text)

    res = _doc((out / "gpu-test.json").read_text())["result"]
    assert res["ok"] and res["summary"] == "2/2 ranks OK on 1 host"
    assert [(x["identity"]["rank"], x["identity"]["local_rank"], x["identity"]["device"]) for x in res["ranks"]] \
        == [(0, 0, "cpu"), (1, 1, "cpu")]
    assert all(s["status"] == "ok" for x in res["ranks"] for s in x["stages"])
    assert res["versions"]["torch"].startswith("2.")
    lines = (out / "gpu-test.rank00001.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["event"] == "local" and json.loads(lines[-1])["event"] == "done"
    _no_process_mentions(str(out))


def test_missing_rank_is_named_and_everyone_exits(tmp_path: Path) -> None:
    # --stage-timeout bounds the device stage, which imports torch (seconds on a loaded node); --init-timeout is
    # the wait for the rank that never comes, with room for the other rank's start-up under load
    t0 = time.monotonic()
    with reserved_port() as port:
        results = _wait([_hand(r, 3, port, "--json", "--stage-timeout", "30", "--init-timeout", "10", "--out-dir",
                               str(tmp_path)) for r in range(2)], timeout=90)
    assert [rc for rc, _, _ in results] == [4, 4], [se[-1500:] for _, _, se in results]
    res = _doc(results[0][1])["result"]
    assert res["missing_ranks"] == [2]
    assert "rank 2 (?) never answered (never checked in)" in res["summary"]
    assert "rank(s) 2 never checked in" in results[1][2]
    # each rank's own line was written before any collective
    for rank in (0, 1):
        first = json.loads((tmp_path / f"gpu-test.rank{rank:05d}.jsonl").read_text().splitlines()[0])
        assert first["event"] == "local" and [s["name"] for s in first["stages"]] == ["device", "alloc"]
    assert time.monotonic() - t0 < 80


def test_missing_rank_zero_each_rank_keeps_its_line(tmp_path: Path) -> None:
    with closed_port() as port:  # nobody listens there: rank 0 never started
        # --stage-timeout bounds the device stage, which imports torch: 3 s was too short on a loaded node ("device
        # hung for 8 s"); the store that is not there is given up after --init-timeout
        (rc, so, se), = _wait([_hand(1, 2, port, "--json", "--stage-timeout", "30", "--init-timeout", "3", "--out-dir",
                                     str(tmp_path))], timeout=60)
    assert rc == 4 and so == ""
    assert "could not reach rank 0's store" in se
    lines = [json.loads(x) for x in (tmp_path / "gpu-test.rank00001.jsonl").read_text().splitlines()]
    assert lines[0]["event"] == "local"
    assert any(s["name"] == "rendezvous" and s["status"] == "timeout" for s in lines[-1]["stages"])


def test_killed_rank_is_named_by_survivors(tmp_path: Path) -> None:
    out = tmp_path / "gt-killed"
    r = mldebug("gpu-test", "--json", "--stage-timeout", "10", "--out-dir", str(out), *TWO_CPU_RANKS,
                env=faults.env("gpu-test.die:rank=1,stage=broadcast"), timeout=180)
    assert r.returncode == 4, r.stderr[-2000:]
    res = _doc(r.stdout)["result"]
    assert res["missing_ranks"] == [1]
    assert "rank 1 (" in res["summary"] and "stopped during broadcast" in res["summary"]
    assert res["ranks"][0]["stages"][6]["status"] in ("fail", "timeout")
    _no_process_mentions(str(out))


def test_wrong_value_fails_all_reduce_on_that_rank() -> None:
    r = mldebug("gpu-test", "--json", "--stage-timeout", "20", *TWO_CPU_RANKS, env=faults.env("gpu-test.wrong-value:rank=1"),
                timeout=180)
    assert r.returncode == 1, r.stderr[-2000:]
    res = _doc(r.stdout)["result"]
    assert [(f["rank"], f["stage"], f["status"]) for f in res["failures"]] == [(1, "all_reduce", "fail")]
    assert "contributed 1002 instead of 2" in res["failures"][0]["detail"]
    assert res["summary"] == "1/2 ranks OK: rank 1 on " + res["hosts"][0] + " failed at all_reduce"
    assert [w for w in res["warnings"] if "TEST-ONLY" in w] == [
        "TEST-ONLY hooks active (MLDEBUG_TEST_HOOKS=tests.fakes.faults): gpu-test.wrong-value:rank=1"]


def test_wrong_layout_two_ranks_claim_one_local_slot() -> None:
    with reserved_port() as port:
        results = _wait([_hand(r, 2, port, "--json", "--stage-timeout", "10", local=0) for r in range(2)], timeout=120)
    assert [rc for rc, _, _ in results] == [1, 1], results[0][2][-1500:]
    res = _doc(results[0][1])["result"]
    assert {(f["rank"], f["stage"]) for f in res["failures"]} == {(0, "all_gather"), (1, "all_gather")}
    assert "local rank 0" in res["failures"][0]["detail"]


def test_isolate_points_at_the_bad_slot() -> None:
    r = mldebug("gpu-test", "--isolate", "--json", "--stage-timeout", "20", *TWO_CPU_RANKS,
                env=faults.env("gpu-test.wrong-value:device=1"), timeout=300)
    assert r.returncode == 1, r.stderr[-2000:]
    res = _doc(r.stdout)["result"]
    assert [e["members"] for e in res["entries"]] == [[0], [1], [0, 1]]
    assert [e["ok"] for e in res["entries"]] == [True, False, False]
    assert res["suspects"] == ["slot 1 fails alone"]


@pytest.mark.parametrize("args,env,code", [
    (["--backend", "nccl"], {}, 3),
    (["--backend", "bogus"], {}, 2),
    (["--isolate"], {"RANK": "0", "WORLD_SIZE": "1"}, 2),
    (["--out-dir", "/proc/no-such-dir/out"], {}, 2),  # said once, before the ranks (was: once per rank, exit 0)
])
def test_bad_input(args: list[str], env: dict[str, str], code: int) -> None:
    import torch

    r = mldebug("gpu-test", "--nproc-per-node", "2", *args, env=env, timeout=120)
    if code == 3 and torch.cuda.is_available():  # nccl is there: one rank passes every stage
        assert r.returncode == 0, r.stderr
        return
    assert r.returncode == code, r.stderr
    assert r.stderr.count("mldebug: error:") == 1 and "hint:" in r.stderr
