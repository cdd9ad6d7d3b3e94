"""The node history: a real SQLite file, several writers at once, versioned schema, the operator's
questions (`mldebug history`), and the health hook's edges that need no second Slurm
(tests/rig/test_slurm_hook.py drives the hook from Slurm itself)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ml_debug.core.errors import EnvironmentProblem, UsageError
from ml_debug.history import queries
from ml_debug.history.store import MIGRATIONS, SCHEMA_VERSION, CheckRow, open_history
from tests.conftest import mldebug, require, validate_schema
from tests.fakes import REPO
from tests.fakes.nvml import env as nvml_env
from tests.fakes.nvml import healthy_gpu

WRITER = textwrap.dedent("""
    import sys
    from ml_debug.history.store import CheckRow, open_history
    path, node, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    sys.stdout.write("ready\\n"); sys.stdout.flush()
    sys.stdin.readline()  # both writers start together
    for i in range(n):
        with open_history(path) as h:  # a new connection each time, as each hook run opens its own
            h.record_run(node, "slurm-check", i % 2 == 0, f"run {i}",
                         [CheckRow("gpu.row_remap", f"gpu{g}", "pass", "ok", "") for g in range(4)])
            h.record_action(node, "drain", f"mldebug: {i}", "test")
""")


def test_two_writers_at_once_lose_nothing(tmp_path: Path) -> None:
    db = tmp_path / "h" / "history.db"
    n = 60
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(db), node, str(n)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
             for node in ("node1", "node2")]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline() == "ready\n"
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    with open_history(db) as h:
        assert queries.counts(h) == {"runs": 2 * n, "checks": 2 * n * 4, "actions": 2 * n, "incidents": 0}
        per_node = {r[0]: r[1] for r in h.query("SELECT node, COUNT(*) FROM runs GROUP BY node")}
        assert per_node == {"node1": n, "node2": n}
        assert h.query("PRAGMA journal_mode")[0][0] == "wal"


def test_failing_since_and_recurring_nodes(tmp_path: Path) -> None:
    db = tmp_path / "history.db"
    ok = [CheckRow("gpu.row_remap", "gpu3", "pass", "pending=no", "")]
    bad = [CheckRow("gpu.row_remap", "gpu3", "fail", "pending=yes", "reset the GPU")]
    with open_history(db) as h:
        h.record_run("node17", "slurm-check", False, "x", bad, ts=100)
        h.record_run("node17", "slurm-check", True, "x", ok, ts=200)   # healed, then failing again:
        h.record_run("node17", "slurm-check", False, "x", bad, ts=300)  # the streak starts here
        h.record_run("node17", "slurm-check", False, "x", bad, ts=400)
        h.record_run("node3", "slurm-check", False, "x", bad, ts=150)
        h.record_run("node3", "slurm-check", True, "x", ok, ts=250)    # failed, but healthy now
        # six failed jobs: node17 in four of them, first in two
        for j, (nodes, first) in enumerate([(["node17", "node2"], "node17"), (["node2"], "node2"),
                                            (["node17", "node5"], "node5"), (["node17"], "node17"),
                                            (["node9"], "node9"), (["node17", "node9"], "node9")]):
            h.record_incident("logs", f"job{j}", nodes, first, "boom", ts=1000 + j)
        h.record_incident("logs", "job5", ["node17", "node9"], "node9", "boom again", ts=1005)  # read twice: replaced
        failing = queries.failing(h)
        recurring = queries.recurring(h, window=6)
        timeline = queries.timeline(h, "node17")
    assert [(f.node, f.check, f.target, f.since, f.last, f.runs) for f in failing] == [
        ("node17", "gpu.row_remap", "gpu3", 300, 400, 2)]
    assert recurring[0].line == "node17: in 4 of the last 6 failed jobs, twice as the first failure"
    assert recurring[1].line == "node9: in 2 of the last 6 failed jobs, twice as the first failure"
    assert [e.kind for e in timeline] == ["fail", "healthy", "fail", "fail", "incident", "incident", "incident",
                                          "incident"]

    proc = mldebug("history", "--history", str(db), "--json")
    assert proc.returncode == 1, proc.stderr  # a node fails a check now
    doc = json.loads(proc.stdout)
    validate_schema(doc, "history")
    assert doc["result"]["failing"][0]["node"] == "node17"
    human = mldebug("history", "--history", str(db))
    assert "node17: in 4 of the last 6 failed jobs, twice as the first failure" in human.stdout
    unknown = mldebug("history", "--history", str(db), "--node", "node99")
    assert unknown.returncode == 2 and "names no node 'node99'" in unknown.stderr and "hint:" in unknown.stderr


def test_a_corrupt_or_newer_database_is_a_clear_error_and_left_as_it_is(tmp_path: Path) -> None:
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(b"this is not SQLite\n" * 300)
    before = corrupt.read_bytes()
    proc = mldebug("history", "--history", str(corrupt))
    assert proc.returncode == 2, proc.stderr
    assert "not a readable SQLite database" in proc.stderr and "move it aside" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert corrupt.read_bytes() == before

    newer = tmp_path / "newer.db"
    with sqlite3.connect(newer) as con:
        con.execute("CREATE TABLE future(x)")
        con.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    con.close()
    before = newer.read_bytes()
    with pytest.raises(EnvironmentProblem, match="newer mldebug|schema version"):
        open_history(newer)
    proc = mldebug("history", "--history", str(newer))
    assert proc.returncode == 3 and f"schema version {SCHEMA_VERSION + 1}" in proc.stderr, proc.stderr
    assert newer.read_bytes() == before

    # a version 1 file (before old results were pruned) is migrated in place, its rows kept
    v1 = tmp_path / "v1.db"
    with sqlite3.connect(v1) as con:
        con.executescript(MIGRATIONS[1] + "; PRAGMA user_version = 1;")
        con.execute("INSERT INTO runs(ts, node, source, ok, summary) VALUES (1, 'node1', 'slurm-check', 1, 'ok')")
    con.close()
    with open_history(v1) as h:
        assert h.version == SCHEMA_VERSION == 2 and queries.counts(h)["runs"] == 1
        indexes = {r[0] for r in h.query("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert {"checks_by_ts", "runs_by_ts"} <= indexes

    # version 0 (an empty file) is migrated to the current schema
    empty = tmp_path / "empty.db"
    empty.touch()
    with open_history(empty) as h:
        assert h.version == SCHEMA_VERSION and queries.counts(h)["runs"] == 0


def test_old_results_are_pruned_drains_and_incidents_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import ml_debug.history.store as store

    monkeypatch.setattr(store, "PRUNE_EVERY", 4)  # the 4th run prunes
    monkeypatch.setenv(store.DAYS_ENV, "1")
    old = time.time() - 3 * 86400
    row = [CheckRow("host.shm", "host", "fail", "missing", "")]
    with open_history(tmp_path / "h.db") as h:
        h.record_run("node1", "slurm-check", False, "x", row, ts=old)
        h.record_action("node1", "drain", "mldebug: host.shm missing", "root", ts=old)
        h.record_incident("logs", "job1", ["node1"], "node1", "boom", ts=old)
        for _ in range(3):
            h.record_run("node1", "slurm-check", False, "x", row)
        assert queries.counts(h) == {"runs": 3, "checks": 3, "actions": 1, "incidents": 1}
    monkeypatch.setenv(store.DAYS_ENV, "soon")
    with pytest.raises(UsageError, match="not a number of days"):
        store.keep_days()


def test_bad_history_paths_are_refused(tmp_path: Path) -> None:
    proc = mldebug("history", "--history", str(tmp_path))
    assert proc.returncode == 2 and "is a directory" in proc.stderr and "hint:" in proc.stderr
    missing = mldebug("history", "--history", str(tmp_path / "none.db"))
    assert missing.returncode == 2 and "no history database" in missing.stderr
    target = tmp_path / "elsewhere.db"
    target.write_bytes(b"")
    link = tmp_path / "d"
    link.mkdir(mode=0o700)
    (link / "history.db").symlink_to(target)
    with pytest.raises(UsageError, match="symbolic link: not followed"):
        open_history(link / "history.db")
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(UsageError, match="writable by other users"):
        open_history(shared / "history.db")


def test_logs_records_a_failed_jobs_nodes_where_history_is_set(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text("[node7:0]:[rank0]: Traceback (most recent call last):\n"
                   '[node7:0]:[rank0]:   File "train.py", line 3, in <module>\n'
                   "[node7:0]:[rank0]: RuntimeError: CUDA error: an illegal memory access was encountered\n"
                   "[node8:0]:[rank1]: torch.distributed.DistBackendError: NCCL communicator was aborted on rank 1\n")
    db = tmp_path / "h" / "history.db"
    proc = mldebug("logs", str(log), env={"MLDEBUG_HISTORY": str(db)})
    assert proc.returncode == 1, proc.stderr
    with open_history(db) as h:
        rows = h.query("SELECT node, first FROM incidents ORDER BY node")
    assert [tuple(r) for r in rows] == [("node7", 1), ("node8", 0)]


# ----------------------------------------------------------------------------- the hook, without a second Slurm


def _shared_slurm_env() -> dict[str, str]:
    conf = Path("/tmp/mldebug-rig/slurm/etc/slurm.conf")
    require(conf.exists(), "the shared rig's Slurm (tests/rig/up.sh)")
    return {"SLURM_CONF": str(conf)}


def test_hook_refuses_without_scontrol(tmp_path: Path) -> None:
    proc = mldebug("health", "--slurm-check", "--node", "node1", "--no-record",
                   env={"PATH": str(Path(sys.executable).parent)})
    assert proc.returncode == 3, proc.stderr
    assert "scontrol not found" in proc.stderr and "hint:" in proc.stderr


def test_hook_dry_run_is_torch_free_and_changes_nothing(tmp_path: Path) -> None:
    """On the shared rig's Slurm, read only: an unknown node is exit 2; a failing node1 (its NVML fake
    and a --path with shell characters) is 'would drain', node1 keeps its state, no shell ran the path."""

    env = _shared_slurm_env()
    unknown = mldebug("health", "--slurm-check", "--dry-run", "--node", "nosuch", "--no-record", env=env)
    assert unknown.returncode == 2 and "Slurm knows no node 'nosuch'" in unknown.stderr, unknown.stderr

    state_before = subprocess.run(["sinfo", "-h", "-N", "-n", "node1", "-o", "%T|%E"], capture_output=True,
                                  text=True, timeout=30, env={**os.environ, **env}).stdout
    scenario = tmp_path / "nvml.json"
    gpu = healthy_gpu(0)
    gpu["remapped_rows"] = [0, 1, 1, 0]
    scenario.write_text(json.dumps({"gpus": [gpu]}))
    marker = tmp_path / "pwned"
    odd = f"{tmp_path}/no such dir;touch {marker};$(touch {marker})"
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "ml_debug", "--json", "health", "--slurm-check",
                           "--dry-run", "--node", "node1", "--path", odd, "--history", str(tmp_path / "h.db")],
                          capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**os.environ, **env, **nvml_env(scenario)})
    assert proc.returncode == 1, proc.stderr[-3000:]
    imported = {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines()
                if line.startswith("import time:")}
    assert "ml_debug" in imported and "torch" not in imported and "numpy" not in imported
    assert "pydantic" not in imported  # Typer from 0.29 imports it to parse options: 0.2 s more (pyproject.toml)
    doc = json.loads(proc.stdout)
    validate_schema(doc, "slurm-check")
    r = doc["result"]
    assert (r["action"], r["dry_run"], r["node"]) == ("drain", True, "node1")
    assert r["reason"].startswith("mldebug: gpu0 row_remap pending=yes") and r["reason"].endswith("(+1 more)")
    assert "would drain" in r["summary"]
    assert {c["id"] for c in r["failed"]} == {"gpu.row_remap", "host.disk"}
    assert not marker.exists()
    after = subprocess.run(["sinfo", "-h", "-N", "-n", "node1", "-o", "%T|%E"], capture_output=True, text=True,
                           timeout=30, env={**os.environ, **env}).stdout
    assert after.split("|")[1] == state_before.split("|")[1]  # no drain reason appeared
    with open_history(tmp_path / "h.db") as h:
        assert [tuple(a) for a in h.query("SELECT node, action FROM actions")] == [("node1", "would-drain")]
        assert h.query("SELECT COUNT(*) FROM checks WHERE status = 'fail'")[0][0] == 2


def test_a_watch_incident_records_its_nodes_where_history_is_set(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """What `mldebug watch` calls when it has written an incident bundle (the function the watch loop calls)."""
    import time

    from ml_debug.compose.watch_loop import _record_in_history
    from ml_debug.watch.verdict import Incident

    inc = Incident("stall", time.time(), "rank 1 made no progress", ranks=[{"rank": 1, "host": "node3"},
                                                                           {"rank": 0, "host": "node4"}])
    result = {"culprit": {"host": "node3", "pid": 42}, "summary": "rank 1 (node3) stalled in all_reduce"}
    monkeypatch.delenv("MLDEBUG_HISTORY", raising=False)
    _record_in_history(inc, result, tmp_path / "bundle")  # no history configured: nothing written anywhere
    db = tmp_path / "h" / "history.db"
    monkeypatch.setenv("MLDEBUG_HISTORY", str(db))
    assert not db.exists()
    _record_in_history(inc, result, tmp_path / "bundle")
    with open_history(db) as h:
        rows = [tuple(r) for r in h.query("SELECT source, job, node, first FROM incidents ORDER BY node")]
        line = queries.recurring(h)[0].line
    assert rows == [("watch", str(tmp_path / "bundle"), "node3", 1), ("watch", str(tmp_path / "bundle"), "node4", 0)]
    assert line == "node3: in 1 of the last 1 failed jobs, once as the first failure"


def test_history_reads_only_its_own_database_and_changes_no_byte(tmp_path: Path) -> None:
    """`mldebug history` is a reader: another application's SQLite file and an empty file are refused
    (exit 2) and stay byte-identical, with no -wal, -shm or -lock file beside them; a writer (the health
    hook) never adds its tables to another application's database either. --failed-jobs beyond SQLite's
    integers is a usage error, not an OverflowError."""
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as con:
        con.execute("CREATE TABLE photos(id INTEGER PRIMARY KEY, name TEXT)")
        con.execute("INSERT INTO photos(name) VALUES ('cat.jpg')")
    con.close()
    empty = tmp_path / "empty.db"
    empty.touch()
    for path, why in ((other, "schema version 0, no table actions, checks, incidents, runs"), (empty, "empty")):
        before, listing = path.read_bytes(), sorted(os.listdir(tmp_path))
        proc = mldebug("history", "--history", str(path))
        assert proc.returncode == 2, proc.stderr
        assert f"{path} is not an mldebug history database ({why})" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
        assert path.read_bytes() == before and sorted(os.listdir(tmp_path)) == listing
    with pytest.raises(UsageError, match="not an mldebug history database .*photos"):
        open_history(other)
    assert "photos" in other.read_bytes().decode("latin-1") and b"checks" not in other.read_bytes()

    ours = tmp_path / "ours.db"
    with open_history(ours) as h:
        h.record_incident("logs", "job1", ["node1"], "node1", "boom")
    before = ours.read_bytes()
    ok = mldebug("history", "--history", str(ours), "--failed-jobs", "5")
    assert ok.returncode == 0 and "1 job incidents" in ok.stdout, ok.stderr
    assert ours.read_bytes() == before
    huge = mldebug("history", "--history", str(ours), "--failed-jobs", str(10**20))
    assert huge.returncode == 2 and "--failed-jobs" in huge.stderr and "internal error" not in huge.stderr, huge.stderr
