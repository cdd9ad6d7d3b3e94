"""`mldebug drill` on real jobs: every drill names the injected rank, nothing is left behind, and a
diagnosis broken on purpose is scored as missed (exit 1)."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from ml_debug.core.errors import UsageError
from ml_debug.drill.options import DRILLS, parse_only
from ml_debug.drill.run import plan_for
from ml_debug.drill.workspace import TOKEN_VAR, result_of
from tests.conftest import REPO, pids_with_env, require, wait_until
from tests.fakes import hooks_env

SCHEMA = json.loads((REPO / "ml_debug" / "schemas" / "drill.json").read_text())
MARK = "MLDEBUG_DRILL_TEST_MARK"


def _drill(*args: str, env: dict[str, str] | None = None, timeout: float = 900) -> tuple[subprocess.CompletedProcess[str], str]:
    """Run `mldebug drill ... --json`; also the marker every process it started inherits."""
    mark = uuid.uuid4().hex
    proc = subprocess.run([sys.executable, "-m", "ml_debug", "drill", *args, "--json"], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO,
                          env={**os.environ, "OMP_NUM_THREADS": "1", MARK: mark, **(env or {})})
    return proc, mark


def _result(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    doc = json.loads(proc.stdout)
    jsonschema.validate(doc, SCHEMA)
    return doc["result"]  # type: ignore[no-any-return]


def _carrying(result: dict[str, Any]) -> list[int]:
    """Live processes that carry the token of one of the result's drills."""
    return [pid for d in result["drills"] for pid in pids_with_env(TOKEN_VAR, d["token"])]


def _left_behind(mark: str) -> list[int]:
    """Processes a drill started (they carry its token) that are still alive after it ended."""
    left = []
    for pid in pids_with_env(MARK, mark):
        try:
            if TOKEN_VAR.encode() in Path(f"/proc/{pid}/environ").read_bytes():
                left.append(pid)
        except OSError:
            continue  # it ended meanwhile
    return left


def _run_locally(drills: list[str], seed: int, tmp_path: Path) -> dict[str, dict[str, Any]]:
    """`mldebug drill --only DRILLS --seed SEED` on this node: every drill correct, on the rank the seed
    draws, with its evidence; nothing left running. The outcomes by drill."""
    require(subprocess.run(["py-spy", "--version"], capture_output=True).returncode == 0, "py-spy")
    proc, mark = _drill("--only", ",".join(drills), "--seed", str(seed), "--bundle-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    result = _result(proc)
    assert result["ok"] and result["seed"] == seed and result["missed"] == 0 and result["errors"] == 0
    assert (result["site"], result["nodes"]) == ("this node", 1) and not result["interrupted"]
    assert [d["drill"] for d in result["drills"]] == drills
    rng = random.Random(seed)
    for d in result["drills"]:
        plan = plan_for(d["drill"], rng, 2)  # the seed says which rank was hit
        assert d["status"] == "correct", d
        assert d["injected"]["node"] == result["host"], d
        assert d["injected"]["rank"] == plan.rank and d["injected"]["peer"] == plan.peer, d
        expected = sorted({plan.rank, plan.peer} - {None})  # type: ignore[type-var]
        assert d["named"]["ranks"] == expected and d["named"]["verdict"], d
        assert d["time_to_verdict_s"] is not None and Path(d["evidence"]).is_dir()
        assert f"drill {d['drill']}: correct in " in proc.stderr  # one line per drill as it finishes
    assert result["notes"] == [f"repeat with: mldebug drill --only {','.join(drills)} --seed {seed}"]
    assert not _left_behind(mark), "a drill left processes behind"
    return {d["drill"]: d for d in result["drills"]}


UNTIMED = ["hang", "crash", "segfault", "nan", "desync", "slow-link"]
TIMED = ["straggler", "missing-rank"]
SLURM = ["hang", "exit", "slow-link"]  # the exit drill runs on Slurm only: 2 nodes, where its world is harder to know


def test_the_runs_cover_every_drill() -> None:
    assert sorted(set(UNTIMED + TIMED + SLURM)) == sorted(DRILLS)


def test_drills_judged_by_stacks_logs_and_links_name_the_injected_rank(tmp_path: Path) -> None:
    by = _run_locally(UNTIMED, 11, tmp_path)
    assert "injected_hang" in by["hang"]["named"]["where"]
    assert (Path(by["hang"]["evidence"]) / "dump-stacks.json").stat().st_size > 0
    assert "InjectedCrash" in by["crash"]["named"]["where"] and (Path(by["crash"]["evidence"]) / "logs").is_dir()
    assert "Segmentation fault" in by["segfault"]["named"]["where"]
    # every rank raised the same error about the injected rank: that rank is the first failure
    assert by["nan"]["named"]["verdict"].startswith(f"first failure: rank {by['nan']['injected']['rank']} ")
    assert "all_reduce" in by["desync"]["named"]["where"]
    assert by["slow-link"]["named"]["where"] == by["slow-link"]["injected"]["where"]
    # allreduce-bench --pairwise on 4 ranks measured every pair, and only the injected link is slow
    bench = result_of((Path(by["slow-link"]["evidence"]) / "allreduce-bench.json").read_text())
    assert bench is not None
    pairs = bench["pairwise"]
    assert bench["mode"] == "pairwise" and pairs["units"] == "rank" and pairs["rounds"] == 3 and pairs["passes"] == 3
    assert all(pairs["matrix"][a][b] is not None for a in range(4) for b in range(4) if a != b)
    link = by["slow-link"]["injected"]
    assert [(x["a"], x["b"]) for x in pairs["slow_links"]] == [(link["rank"], link["peer"])] and not pairs["slow_units"]
    # named only after measuring it again confirmed it; any other pair measured again was cleared
    again = {(r["a"], r["b"]): r for r in pairs["remeasured"]}
    assert again[(link["rank"], link["peer"])]["slow"] and again[(link["rank"], link["peer"])]["again"], again
    assert [p for p, r in again.items() if r["slow"]] == [(link["rank"], link["peer"])], again
    assert "slow link" in bench["summary"] and bench["test_faults"].startswith("mldebug drill: slow-pair:"), bench
    # Each fault did what `mldebug train --inject` says, read from the drills' evidence (tests/cli/test_train_faults.py
    # has the other faults): the hung rank sleeps outside any collective while its peer waits in one ...
    hang = by["hang"]["injected"]["rank"]
    stacks = json.loads((Path(by["hang"]["evidence"]) / "dump-stacks.json").read_text())["result"]
    group_of = {rank: g for g in stacks["groups"] for rank in g["ranks"]}
    assert sorted(group_of) == [0, 1] and group_of[hang]["collective"] is None, stacks["groups"]
    assert group_of[hang]["location"]["name"] == "injected_hang"
    assert group_of[1 - hang]["collective"]["file"].endswith("distributed_c10d.py"), group_of[1 - hang]
    # ... and the crashing rank's traceback reached torchrun through its torchelastic error file
    crash = by["crash"]["injected"]
    root = (Path(by["crash"]["evidence"]) / "launch.log").read_text().split("Root Cause", 1)[-1]
    assert f"rank      : {crash['rank']} (local_rank: {crash['rank']})" in root, root
    assert re.search(r"error_file: /\S+/error\.json", root) and "injected_crash" in root, root
    assert f"InjectedCrash: injected crash on rank {crash['rank']} at step {crash['step']}" in root, root


@pytest.mark.serial  # the straggler drill judges step rates; gpu-test's stage timeouts need a quiet node
def test_drills_judged_by_timing_name_the_injected_rank(tmp_path: Path) -> None:
    by = _run_locally(TIMED, 11, tmp_path)
    assert by["straggler"]["diagnosis"].startswith("mldebug watch --pid ")
    assert by["straggler"]["named"]["where"] == "straggler"
    # watch named a straggler, not a hang, from the job's collectives and its progress files
    slow = by["straggler"]["injected"]["rank"]
    evidence = Path(by["straggler"]["evidence"])
    result = json.loads((evidence / "watch.json").read_text())["result"]
    assert result["incident"]["kind"] == "straggler", result["summary"]
    assert result["culprit"]["rank"] == slow and result["culprit"]["why"] == "straggler"
    assert result["summary"].startswith(f"rank {slow} (") and \
        f" is a straggler: rank {1 - slow} waited in collectives" in result["summary"] and \
        "injected_straggler_delay" in result["summary"], result["summary"]
    ranks = {r["rank"]: r for r in result["ranks"]}
    assert ranks[slow]["status"] == "straggler" and ranks[1 - slow]["status"] == "ok"
    assert ranks[0]["progress_file"]["path"] == str(evidence / "metrics" / "rank-0.jsonl")
    tails = sorted((evidence / "incident").glob("progress-*.tail"))
    assert len(tails) == 2 and all('"step"' in t.read_text() for t in tails)
    assert "1 of 2 ranks started" in by["missing-rank"]["diagnosis"]


def test_a_diagnosis_broken_on_purpose_is_missed_with_exit_1(tmp_path: Path) -> None:
    """`mldebug logs`' first-failure rule switched off (tests/fakes/broken_rules.py): the crash drill is
    missed, exit 1, and the table says what was named instead."""
    mark = uuid.uuid4().hex
    proc = subprocess.run([sys.executable, "-m", "ml_debug", "drill", "--only", "crash", "--seed", "3",
                           "--bundle-dir", str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={**os.environ, **hooks_env("tests.fakes.broken_rules",
                                                         {"OMP_NUM_THREADS": "1", "MLDEBUG_WIDTH": "200", MARK: mark})})
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert "mldebug drill: 0/1 drills named the injected rank; missed: crash" in lines[0], lines[:3]
    (row,) = [" ".join(c) for c in (line.split("│")[1:-1] for line in lines if line.startswith("│")) if c[0].strip()]
    assert row.split()[0] == "crash" and "missed: named no rank" in row and "mldebug logs logs" in row, row
    assert "drill crash: missed in " in proc.stderr
    assert not _left_behind(mark)


@pytest.mark.parametrize("text", ["hang,nope", "", ","])
def test_only_rejects_an_unknown_drill_with_the_list(text: str) -> None:
    with pytest.raises(UsageError) as e:
        parse_only(text)
    assert "drills: hang,straggler" in (e.value.hint or "")
    proc = subprocess.run([sys.executable, "-m", "ml_debug", "drill", "--only", text or ","], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "unknown drill" in proc.stderr


def test_one_rank_on_this_node_is_a_usage_error() -> None:
    proc = subprocess.run([sys.executable, "-m", "ml_debug", "drill", "--nproc-per-node", "1"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "leaves the injected rank no peer" in proc.stderr, proc.stderr
    assert "hint: give --nproc-per-node 2 or more" in proc.stderr


@pytest.mark.rig
def test_drills_as_slurm_jobs_over_two_rig_nodes(rig_slurm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A long training job diagnosed with --slurm-job (hang), a job that ends by itself read by `mldebug logs`
    (exit: the last rank leaves without a word) and the pairwise bench over 3 nodes (slow-link). (gpu-test
    with a task that never starts, srun --multi-prog, judges stage timeouts: it is run by hand, see the
    docs, not in the parallel part of the suite.)"""
    proc, mark = _drill("--slurm-partition", "debug", "--only", ",".join(SLURM), "--seed", "5",
                        "--bundle-dir", str(tmp_path),
                        env={**rig_slurm.env, "GLOO_SOCKET_IFNAME": "eth0",
                             "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    result = _result(proc)
    assert (result["site"], result["nodes"]) == ("Slurm partition debug, 2 nodes per job", 2)
    by = {d["drill"]: d for d in result["drills"]}
    assert all(d["status"] == "correct" for d in by.values()), [(d["drill"], d["why"]) for d in by.values()]
    rng = random.Random(5)
    for drill in by:  # the seed draws for the chosen drills only, in the catalogue's order
        assert by[drill]["injected"]["rank"] == plan_for(drill, rng, 2, nodes=2).rank, drill
    hang = by["hang"]
    assert hang["diagnosis"].startswith("mldebug dump-stacks --slurm-job ")
    # rank r of a 2-node x 2-rank job runs on the (r // 2)-th node, and dump-stacks names that node
    assert hang["injected"]["node"] in rig_slurm.nodes and hang["named"]["node"] == hang["injected"]["node"]
    assert by["exit"]["named"]["ranks"] == [by["exit"]["injected"]["rank"]]
    assert by["slow-link"]["diagnosis"].startswith("srun mldebug allreduce-bench --pairwise")
    assert "slow link" in by["slow-link"]["named"]["verdict"]
    assert not _left_behind(mark) and not _carrying(result)
    # every job of the drills left the queue
    assert not rig_slurm.run(["squeue", "-h", "-n", "mldebug-drill-hang", "-o", "%i"]).stdout.strip()


@pytest.mark.rig
@pytest.mark.parametrize(("args", "words"), [
    (["--slurm-partition", "nosuch"], "mldebug: error: --slurm-partition nosuch: Partition nosuch not found"),
    (["--slurm-partition", "debug", "--sbatch-arg", ""], "mldebug: error: --sbatch-arg is empty"),
])
def test_a_slurm_request_slurm_would_refuse_is_a_usage_error(rig_slurm, args: list[str], words: str) -> None:  # type: ignore[no-untyped-def]
    """Said once, before any drill (each drill's sbatch failed, 'could not run', exit 4)."""
    proc = subprocess.run([sys.executable, "-m", "ml_debug", "drill", *args, "--only", "crash"], capture_output=True,
                          text=True, timeout=60, cwd=REPO, env={**os.environ, **rig_slurm.env})
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0] == words and lines[1].startswith("hint: ") and len(lines) == 2, proc.stderr


@pytest.mark.rig
def test_drills_over_ssh_on_three_rig_nodes(rig_ssh, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Each job spans the rig's netns nodes, one ssh session per node; the diagnosis reaches the same hosts
    over ssh and finds the job's ranks by the drill's token."""
    hosts = str(rig_ssh.hostfile(rig_ssh.nodes))
    proc, _ = _drill("--hosts", hosts, "--ssh-config", str(rig_ssh.ssh_config), "--remote-python", sys.executable,
                     "--only", "hang,crash,slow-link", "--seed", "4", "--nproc-per-node", "1",
                     "--bundle-dir", str(tmp_path), env={"GLOO_SOCKET_IFNAME": "eth0"})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    result = _result(proc)
    assert (result["site"], result["nodes"]) == ("3 hosts over ssh", 3)
    by = {d["drill"]: d for d in result["drills"]}
    assert all(d["status"] == "correct" for d in by.values()), [(d["drill"], d["why"]) for d in by.values()]
    rng = random.Random(4)
    for drill in by:
        assert by[drill]["injected"]["rank"] == plan_for(drill, rng, 1, nodes=3).rank, drill
    hang = by["hang"]
    assert hang["diagnosis"].startswith(f"mldebug dump-stacks --hosts {hosts} --ssh-config ")
    assert "--env MLDEBUG_DRILL_TOKEN=" in hang["diagnosis"]
    names = [n.name for n in rig_ssh.nodes]
    # rank r of 3 nodes x 1 rank runs on the r-th host (one rank per node: a light job; the Slurm test
    # checks the r // nproc mapping with 2 ranks per node), and the diagnosis names that host
    assert hang["injected"]["node"] == names[hang["injected"]["rank"]] == hang["named"]["node"]
    assert by["crash"]["named"]["node"] == names[by["crash"]["injected"]["rank"]]
    assert "over ssh (3 nodes)" in by["slow-link"]["diagnosis"]
    # allreduce-bench --pairwise self-launched on each host (--nnodes 3 --node-rank i): its units are the nodes
    bench = result_of((Path(by["slow-link"]["evidence"]) / "allreduce-bench.json").read_text())
    assert bench is not None and bench["nnodes"] == 3, bench
    assert bench["pairwise"]["units"] == "node" and len(bench["pairwise"]["names"]) == 3
    assert all(bench["pairwise"]["matrix"][a][b] for a in range(3) for b in range(3) if a != b)
    # processes started by sshd do not inherit this test's marker: look for the drills' own tokens
    assert not _carrying(result), "a drill left processes behind on a node"
    assert result["notes"][0].startswith(f"repeat with: mldebug drill --only hang,crash,slow-link --nproc-per-node 1 "
                                         f"--seed 4 --hosts {hosts} --ssh-config ")


def test_ctrl_c_tears_the_running_drill_down_and_reports_the_finished_ones(tmp_path: Path) -> None:
    require(subprocess.run(["py-spy", "--version"], capture_output=True).returncode == 0, "py-spy")
    mark = uuid.uuid4().hex
    proc = subprocess.Popen([sys.executable, "-m", "ml_debug", "drill", "--only", "crash,desync", "--seed", "2",
                             "--bundle-dir", str(tmp_path), "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1", MARK: mark})
    try:
        # the crash drill is done and the desync drill's job is training: interrupt now
        wait_until(lambda: any((tmp_path / "desync" / "metrics").glob("rank-*.jsonl")), 240,
                   "the desync drill's job to start training")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-3000:]
    doc = json.loads(out)
    jsonschema.validate(doc, SCHEMA)
    result = doc["result"]
    assert result["interrupted"] and not result["ok"]
    assert [d["drill"] for d in result["drills"]] == ["crash"] and result["drills"][0]["status"] == "correct"
    assert result["summary"] == "1/1 drills named the injected rank; interrupted before desync"
    wait_until(lambda: not _left_behind(mark), 30, "the desync drill's processes to be gone")
