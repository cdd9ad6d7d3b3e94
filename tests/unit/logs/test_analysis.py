"""`mldebug logs` on small files: labels, time stamps, classification, NCCL insight, sources, the CLI.

The NCCL files under tests/data/logs/ are real-format NCCL_DEBUG=INFO lines (see the README there).
The job logs written by real runs are in tests/cli/test_logs_real_jobs.py.
"""

from __future__ import annotations

import datetime as _dt
import gzip
import json
import os
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from ml_debug.core.errors import UsageError
from ml_debug.launch.options import LaunchJobOptions
from ml_debug.launch.run import PREFIX_TEMPLATE, plan, prepare
from ml_debug.logs import scan
from ml_debug.logs.events import classify
from ml_debug.logs.labels import find_time, split_label
from ml_debug.logs.result import PRIMARY, SECONDARY, Who
from ml_debug.logs.triage import triage
from tests.conftest import REPO, require, validate_schema

DATA = REPO / "tests" / "data" / "logs"
DAY = _dt.date(2025, 3, 2)


def _cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MLDEBUG_JSON", "COLUMNS")}
    return subprocess.run([sys.executable, "-m", "ml_debug", *args], capture_output=True, text=True, timeout=60,
                          input=stdin, env=env)


# ----------------------------------------------------------------------------- labels and times


@pytest.mark.parametrize(("line", "who", "rest"), [
    ("  3: hello", Who(3, None, None), "hello"),
    ("[default1]:hello", Who(None, None, 1), "hello"),
    ("[node12:5]:hello", Who(None, "node12", 5), "hello"),
    ("[node-12:5]:[rank37]: Traceback (most recent call last):", Who(37, "node-12", 5),
     "Traceback (most recent call last):"),
    ("[node12:5 rank37]:x", Who(37, "node12", 5), "x"),
    ("[host1:0] File x", Who(None, "host1", 0), "File x"),
    ("[c4140-02:236649] Signal: Segmentation fault (11)", Who(), "[c4140-02:236649] Signal: Segmentation fault (11)"),
    ("[job-master-0] [2026-03-30 19:24:35,966] x", Who(None, "job-master-0", None), "[2026-03-30 19:24:35,966] x"),
    ("[rank3]:[E0517 04:12:31.116 ProcessGroupNCCL.cpp:616] y", Who(3, None, None),
     "[E0517 04:12:31.116 ProcessGroupNCCL.cpp:616] y"),
    ("1: [rank1]: RuntimeError: z", Who(1, None, None), "RuntimeError: z"),
    ("[rank0]:[rank0]: Traceback (most recent call last):", Who(0, None, None), "Traceback (most recent call last):"),
    ("[1]:", Who(), "[1]:"),  # torchrun's failure summary numbering, not a label
    ("[2024-05-01 03:14:07] INFO x", Who(), "[2024-05-01 03:14:07] INFO x"),
    ("03:14:07 x", Who(), "03:14:07 x"),
])
def test_labels(line: str, who: Who, rest: str) -> None:
    lab = split_label(line)
    assert (lab.who, lab.rest) == (who, rest)


def test_the_stream_of_a_torchrun_label_ignores_torchs_own_rank_prefix() -> None:
    assert split_label("[vm:2]:[rank2]: Traceback").key == split_label("[vm:2]:plain").key == "[vm:2]:"


@pytest.mark.parametrize(("text", "expect"), [
    ("2025-03-02 03:14:07,123 INFO x", "2025-03-02 03:14:07.123"),
    ("E0302 03:14:07.500000 ProcessGroupNCCL.cpp:1] x", "2025-03-02 03:14:07.500"),
    ("time : 2025-03-02_03:14:07", "2025-03-02 03:14:07.000"),
    ("CANCELLED AT 2025-03-02T03:14:07 ***", "2025-03-02 03:14:07.000"),
    ("Mar  2 03:14:07 node kernel: x", "2025-03-02 03:14:07.000"),
    ("at 03:14:07 something", "2025-03-02 03:14:07.000"),
])
def test_time_stamps(text: str, expect: str) -> None:
    t = find_time(text, DAY)
    assert t is not None
    assert _dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] == expect


@pytest.mark.parametrize(("text", "day", "expect"), [
    ("E1231 23:59:58.000000 ProcessGroupNCCL.cpp:1] x", _dt.date(2027, 1, 2), "2026-12-31 23:59:58"),
    ("Dec 31 23:59:58 node kernel: x", _dt.date(2027, 1, 2), "2026-12-31 23:59:58"),
    ("E1231 23:59:58.000000 x", _dt.date(2026, 12, 31), "2026-12-31 23:59:58"),
    ("E0101 00:00:01.000000 x", _dt.date(2026, 12, 31), "2026-01-01 00:00:01"),
    # a writer whose time zone is ahead of the reader's: a day past the file's day is still its year
    ("E1101 00:30:00.000000 x", _dt.date(2026, 10, 31), "2026-11-01 00:30:00"),
    ("E1104 00:30:00.000000 x", _dt.date(2026, 10, 31), "2025-11-04 00:30:00"),
    ("E0229 12:00:00.000000 x", _dt.date(2028, 3, 1), "2028-02-29 12:00:00"),
    ("E0229 12:00:00.000000 x", _dt.date(2027, 3, 1), None),  # a day the file's year has not: no time
])
def test_a_stamp_without_a_year_is_never_after_its_file(text: str, day: _dt.date, expect: str | None) -> None:
    """glog's and syslog's stamps have no year: a job that ran across New Year, read in January, is in the
    old year (it was the file's year, a year too late)."""
    t = find_time(text, day)
    assert (None if t is None else _dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")) == expect


def test_no_time_stamp() -> None:
    assert find_time("step 1234 | loss 2.34 | lr 3e-4", DAY) is None


@pytest.mark.parametrize(("text", "cls", "label"), [
    ("RuntimeError: CUDA error: an illegal memory access was encountered", PRIMARY,
     "CUDA error: an illegal memory access was encountered"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", PRIMARY, "out of memory"),
    ("ConnectionResetError: [Errno 104] Connection reset by peer", SECONDARY, "Connection reset by peer"),
    ("RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:2134", SECONDARY,
     "Connection closed by peer"),
    ("RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 10000ms "
     "for recv operation to complete", SECONDARY, "gloo timeout waiting for a peer"),
    ("[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE) ran for 600013 "
     "milliseconds before timing out.", SECONDARY, "NCCL watchdog timeout"),
    ("BrokenPipeError: [Errno 32] Broken pipe", SECONDARY, "Broken pipe"),
    ("ValueError: bad batch", PRIMARY, ""),
])
def test_classification(text: str, cls: str, label: str) -> None:
    got_cls, got_label, _ = classify(text)
    assert (got_cls, got_label) == (cls, label)


# ----------------------------------------------------------------------------- NCCL insight (real-format lines)


def _nccl(name: str) -> dict:
    report = triage([str(DATA / name)])
    assert report.nccl is not None
    return report.nccl


def test_a_log_without_a_failure_says_its_nccl_slow_path_findings_first() -> None:
    assert triage([str(DATA / "nccl_ib_two_nodes.log")]).verdict.summary == "no failure found"
    p2p = triage([str(DATA / "nccl_p2p_disabled.log")])  # one warning, one info
    assert p2p.verdict.summary == "no failure found; NCCL: 1 slow-path finding(s), below" and p2p.ok
    socket = triage([str(DATA / "nccl_socket_mismatch.log")]).verdict.summary
    assert socket == "no failure found (1 warning(s)); NCCL: 3 slow-path finding(s), below", socket


def test_nccl_ib_two_nodes_is_clean() -> None:
    n = _nccl("nccl_ib_two_nodes.log")
    assert n["versions"] == {"2.21.5+cuda12.4": 1}
    assert (n["world_size"], n["nodes"]) == (4, 2)
    assert {t["transport"]: t["pairs"] for t in n["transports"]} == {"P2P": 2, "NET/IB": 2}
    hosts = {h["host"]: h for h in n["hosts"]}
    assert hosts["gpu-a01"]["ib_devices"] == ["mlx5_0/IB", "mlx5_1/IB"]
    assert hosts["gpu-a02"]["network"] == ["IB"]
    assert n["ring_count"] == 2 and n["rings"][0]["order"] == "0 1 2 3"
    assert n["trees"] == {"ranks": 4, "per_rank": {2: 4}}
    assert n["findings"] == []


def test_nccl_socket_instead_of_ib_and_interface_mismatch() -> None:
    n = _nccl("nccl_socket_mismatch.log")
    codes = [f["code"] for f in n["findings"]]
    assert codes[:3] == ["socket-not-ib", "nccl-ib-disable", "interface-mismatch"], codes
    socket_finding = n["findings"][0]["text"]
    assert "NCCL_IB_DISABLE=1" in socket_finding
    assert "gpu-b01: bond0" in n["findings"][2]["text"] and "gpu-b02: eth0" in n["findings"][2]["text"]
    assert n["environment"]["NCCL_IB_DISABLE"] == {"1": 4}
    assert n["warnings"][0]["ranks"] == "2" and "socketStartConnect" in n["warnings"][0]["text"]


def test_nccl_p2p_disabled_goes_through_shared_memory() -> None:
    n = _nccl("nccl_p2p_disabled.log")
    assert {t["transport"] for t in n["transports"]} == {"SHM"}
    codes = {f["code"]: f["severity"] for f in n["findings"]}
    assert codes == {"nccl-p2p-disable": "warning", "shm-not-p2p": "info"}


def test_nccl_old_format_without_ib_device() -> None:
    n = _nccl("nccl_old_format.log")
    assert n["versions"] == {"2.4.8+cuda10.1": 1}
    assert {t["transport"]: t["pairs"] for t in n["transports"]} == {"NET/Socket": 2, "SHM": 2}
    assert "no InfiniBand device found on ip-10-0-1-17, ip-10-0-2-41" in n["findings"][0]["text"]
    assert {h["host"]: h["socket_interfaces"] for h in n["hosts"]} == {"ip-10-0-1-17": ["ens5"],
                                                                       "ip-10-0-2-41": ["ens5"]}


def test_nccl_ranks_of_one_node_over_the_network_are_flagged(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("h1:10:11 [0] NCCL INFO comm 0x1 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0\n"
                   "h1:20:21 [1] NCCL INFO comm 0x2 rank 1 nRanks 2 nNodes 1 localRanks 2 localRank 1 MNNVL 0\n"
                   "h1:10:11 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] [send] via NET/Socket/0\n")
    n = triage([str(log)]).nccl
    assert n is not None
    assert "intra-node-net" in [f["code"] for f in n["findings"]]


# ----------------------------------------------------------------------------- verdicts on small logs


def test_watchdog_timeouts_only_name_the_silent_rank() -> None:
    report = triage([str(DATA / "watchdog_one_rank_silent.log")])
    v = report.verdict
    assert v.status == "secondary-only"
    assert v.silent_ranks == "2"
    assert "rank 2 left no failure in the logs" in v.summary
    assert report.progress["nccl_work"]["max_completed"] == 807


def test_a_traceback_without_time_takes_the_time_of_the_line_before(tmp_path: Path) -> None:
    year = _dt.date.today().year  # glog stamps have no year: the file's own is used
    (tmp_path / "rank0.log").write_text(f"{year}-03-02 03:14:09,000 step 12\nTraceback (most recent call last):\n"
                                        '  File "a.py", line 1, in f\nKeyError: 3\n')
    (tmp_path / "rank1.log").write_text("[E0302 03:14:07.000000 x.cpp:1] CUDA error: an illegal memory access\n")
    v = triage([str(tmp_path)]).verdict
    assert v.primary is not None and v.primary.who.rank == 1, v.summary
    assert v.basis == "line time stamps and the time stamps of the lines just before (a lower bound)"
    assert [e.who.rank for e in v.independent] == [0]


def test_without_time_stamps_the_order_across_files_is_unknown(tmp_path: Path) -> None:
    (tmp_path / "rank0.log").write_text('Traceback (most recent call last):\n  File "a.py", line 1, in f\nKeyError: 3\n')
    (tmp_path / "rank1.log").write_text("RuntimeError: CUDA error: an illegal memory access\n")
    v = triage([str(tmp_path)]).verdict
    assert v.primary is not None and v.primary.who.rank == 0, v.summary
    assert v.basis == "file order (time stamps missing; the order across files is not known)"


def test_earliest_primary_by_line_time_stamps(tmp_path: Path) -> None:
    (tmp_path / "rank0.log").write_text("[E0302 03:14:09.000000 x.cpp:1] CUDA error: misaligned address\n")
    (tmp_path / "rank1.log").write_text("[E0302 03:14:07.000000 x.cpp:1] CUDA error: an illegal memory access\n")
    v = triage([str(tmp_path)]).verdict
    assert v.primary is not None and v.primary.who.rank == 1 and v.basis == "line time stamps", v.summary
    assert [e.who.rank for e in v.independent] == [0]


def test_an_exception_a_logger_names_is_weaker_than_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "rank0.log").write_text("2025-03-02 03:14:01,000 ERROR trainer: RuntimeError: boom\n")
    (tmp_path / "rank1.log").write_text('2025-03-02 03:14:07,000 x\nTraceback (most recent call last):\n'
                                        '  File "a.py", line 1, in f\nKeyError: 3\n')
    v = triage([str(tmp_path)]).verdict
    assert v.primary is not None and v.primary.who.rank == 1 and v.primary.message == "KeyError: 3", v.summary


def test_traceback_split_across_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scan, "BLOCK", 64)
    lines = [f"noise line {i}" for i in range(50)]
    lines += ["[rank3]: Traceback (most recent call last):", '[rank3]:   File "t.py", line 9, in <module>',
              "[rank3]:     main()", "[rank3]: IndexError: list index out of range"]
    (tmp_path / "job.log").write_text("\n".join(lines) + "\n")
    report = triage([str(tmp_path / "job.log")])
    assert report.verdict.primary is not None
    assert report.verdict.primary.message == "IndexError: list index out of range"
    assert report.verdict.primary.line == 51
    assert report.tracebacks[0].text[-1] == "IndexError: list index out of range"


def test_slurm_messages(tmp_path: Path) -> None:
    (tmp_path / "slurm-7.out").write_text(
        "srun: error: node2: task 3: Out Of Memory\n"
        "srun: error: node1: tasks 0-1: Exited with exit code 1\n"
        "slurmstepd: error: *** STEP 7.0 ON node1 CANCELLED AT 2025-03-02T03:14:09 ***\n")
    report = triage([str(tmp_path / "slurm-7.out")])
    v = report.verdict
    assert v.primary is not None and (v.primary.who.rank, v.primary.who.node) == (3, "node2"), v.summary
    assert v.primary.kind == "oom"
    limit = tmp_path / "slurm-8.out"
    limit.write_text("slurmstepd: error: *** JOB 8 ON node1 CANCELLED AT 2025-03-02T03:14:09 DUE TO TIME LIMIT ***\n")
    v = triage([str(limit)]).verdict
    assert v.primary is not None and "due to time limit" in v.primary.message


def test_events_stay_bounded(tmp_path: Path) -> None:
    (tmp_path / "rank0.log").write_text("RuntimeError: Connection reset by peer\n" * 5000)
    report = triage([str(tmp_path)])
    assert report.dropped_events > 0
    assert len(report.events) == 1  # one writer, one consequence


# ----------------------------------------------------------------------------- sources


def test_gzip_glob_directory_and_skipped(tmp_path: Path) -> None:
    text = "[rank1]: Traceback (most recent call last):\n[rank1]: ZeroDivisionError: division by zero\n"
    with gzip.open(tmp_path / "a.log.gz", "wt") as f:
        f.write(text)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.out").write_text("nothing to see\n")
    (tmp_path / "sub" / "c.log").symlink_to(tmp_path / "sub" / "b.out")
    os.mkfifo(tmp_path / "sub" / "d.log")
    (tmp_path / "ignored.bin").write_bytes(b"\0" * 10)
    report = triage([str(tmp_path)])
    assert {Path(s.path).name for s in report.sources} == {"a.log.gz", "b.out"}
    assert {Path(s["path"]).name for s in report.skipped} == {"c.log", "d.log"}
    assert report.verdict.primary is not None and report.verdict.primary.who.rank == 1
    by_glob = triage([str(tmp_path / "*.gz")])
    assert [Path(s.path).name for s in by_glob.sources] == ["a.log.gz"]


def test_a_truncated_gzip_file_is_read_up_to_its_cut(tmp_path: Path) -> None:
    text = "".join(f"[rank2]: step {i} loss {i * 7 % 1000 / 7:.6f} {'x' * (i % 80)}\n" for i in range(2000))
    text = "[rank2]: RuntimeError: CUDA error: an illegal memory access was encountered\n" + text
    whole = gzip.compress(text.encode())
    cut = tmp_path / "g3.log.gz"
    cut.write_bytes(whole[:len(whole) // 2])
    readable = zlib.decompressobj(wbits=31).decompress(cut.read_bytes())  # what zcat prints before the cut
    report = triage([str(cut)])
    p = report.verdict.primary
    assert p is not None and p.who.rank == 2 and "illegal memory access" in p.message
    (src,) = report.sources
    assert (src.bytes, src.lines) == (len(readable), readable.count(b"\n") + 1)  # and the cut last line
    assert [s["path"] for s in report.skipped] == [str(cut)] and "truncated" in report.skipped[0]["reason"]
    got = _cli("logs", str(cut))
    assert got.returncode == 1, got.stderr
    assert "not read:" in got.stdout and "truncated" in got.stdout


def test_an_unreadable_subdirectory_is_not_read(tmp_path: Path) -> None:
    """Listed as not read (exit 4), never skipped in silence: the failure may be in it."""
    root = tmp_path / "w"
    (root / "node1").mkdir(parents=True)
    (root / "node2").mkdir()
    (root / "node1" / "console.log").write_text("all good\n")
    (root / "node2" / "console.log").write_text("RuntimeError: CUDA error: an illegal memory access\n")
    (root / "node2").chmod(0)
    # root reads a mode 000 directory: drop the capabilities that let it
    drop = ["setpriv", "--bounding-set=-dac_override,-dac_read_search",
            "--inh-caps=-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
    require(not drop or shutil.which("setpriv"), "setpriv (to read as root without DAC override)")
    env = {k: v for k, v in os.environ.items() if k not in ("MLDEBUG_JSON", "COLUMNS")}
    try:
        got = subprocess.run([*drop, sys.executable, "-m", "ml_debug", "--json", "logs", str(root)],
                             capture_output=True, text=True, timeout=60, env=env)
    finally:
        (root / "node2").chmod(0o755)
    assert got.returncode == 4, got.stdout + got.stderr
    assert json.loads(got.stdout)["result"]["skipped"] == [{"path": str(root / "node2"),
                                                           "reason": "Permission denied"}]


def test_nothing_to_read_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        triage([str(tmp_path / "missing.log")])


def test_error_file_and_metrics(tmp_path: Path) -> None:
    run = tmp_path / "run_x" / "attempt_0" / "3"
    run.mkdir(parents=True)
    (run / "error.json").write_text(json.dumps({"message": {
        "message": "KeyError: 'labels'", "extraInfo": {
            "py_callstack": "Traceback (most recent call last):\n  File \"t.py\", line 3, in f\nKeyError: 'labels'\n",
            "timestamp": "1740881647"}}}))
    (run / "stderr.log").write_text("")
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    for rank, step in ((0, 12), (1, 12), (2, 11), (3, 11)):
        (metrics / f"rank-{rank}.jsonl").write_text("".join(
            json.dumps({"schema": "mldebug.train.step", "schema_version": 1, "rank": rank, "step": s,
                        "time": 1740881600.0 + s}) + "\n" for s in range(1, step + 1)))
    report = triage([str(tmp_path)])
    p = report.verdict.primary
    assert p is not None and p.who.local_rank == 3 and p.kind == "error-file" and p.time == 1740881647.0
    assert report.progress["train"]["behind"] == "2-3" and report.progress["train"]["max_step"] == 12


# ----------------------------------------------------------------------------- the command


def test_cli_exit_codes_json_and_stdin(tmp_path: Path) -> None:
    ok = _cli("logs", str(DATA / "nccl_ib_two_nodes.log"))
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.splitlines()[0] == "no failure found"
    failed = _cli("--json", "logs", str(DATA / "watchdog_one_rank_silent.log"))
    assert failed.returncode == 1
    doc = json.loads(failed.stdout)
    validate_schema(doc, "logs")
    assert doc["result"]["verdict"]["silent_ranks"] == "2"
    piped = _cli("logs", "-", stdin=(DATA / "watchdog_one_rank_silent.log").read_text())
    assert piped.returncode == 1 and piped.stdout.startswith("no primary failure found")
    missing = _cli("logs", str(tmp_path / "nope.log"))
    assert missing.returncode == 2 and "mldebug: error: no logs to read" in missing.stderr
    partial = tmp_path / "p"
    partial.mkdir()
    (partial / "fine.log").write_text("all good\n")
    (partial / "broken.log.gz").write_bytes(b"not gzip at all")
    got = _cli("logs", str(partial))
    assert got.returncode == 4, got.stdout + got.stderr
    assert "not read:" in got.stdout


def test_cli_rank_demux(tmp_path: Path) -> None:
    log = tmp_path / "console.log"
    log.write_text("[vm:0]:hello from 0\n[vm:1]:hello from 1\nW1123 11:07:15.1 1 x] torchrun line\n"
                   "[vm:1]:[rank1]: Traceback (most recent call last):\n[vm:1]:[rank1]: OSError: disk full\n")
    got = _cli("logs", str(log), "--rank", "1")
    assert got.returncode == 0, got.stderr
    assert got.stdout.splitlines() == ["hello from 1", "Traceback (most recent call last):", "OSError: disk full"]
    doc = json.loads(_cli("--json", "logs", str(log), "--node", "vm", "--rank", "0").stdout)
    validate_schema(doc, "logs")
    assert [t["text"] for t in doc["result"]["demux"]["text"]] == ["hello from 0"]
    none = _cli("logs", str(log), "--rank", "7")
    assert none.returncode == 2 and "ranks seen: 0-1" in none.stderr
    empty = _cli("logs", str(log), "--node", "")
    assert empty.returncode == 2 and empty.stderr.splitlines()[0] == "mldebug: error: --node is empty"


# ----------------------------------------------------------------------------- mldebug launch (no run)


def _opts(**kw: object) -> LaunchJobOptions:
    return LaunchJobOptions(**kw)  # type: ignore[arg-type]


def test_launch_plan_is_an_argument_list(tmp_path: Path) -> None:
    p = plan(_opts(command=["python", "-m", "pkg.train", "--lr", "$(rm -rf ~)"], nproc_per_node="4",
                   log_dir=tmp_path), host="node 7")
    assert p.argv[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert p.argv[p.argv.index("--role") + 1] == "node 7:"  # one element, nothing to quote
    assert p.argv[-4:] == ["-m", "pkg.train", "--lr", "$(rm -rf ~)"]
    assert "--standalone" in p.argv and p.argv[p.argv.index("--tee") + 1] == "3"
    assert p.argv[p.argv.index("--log-dir") + 1] == str(tmp_path / "node 7" / "torchelastic")
    assert p.env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] == PREFIX_TEMPLATE
    multi = plan(_opts(command=["train.py"], nnodes="2", rdzv_backend="c10d", rdzv_endpoint="h:29500",
                       log_dir=tmp_path), host="n1")
    assert "--standalone" not in multi.argv and multi.argv[-1] == "train.py"


def test_launch_trace_and_flight_recorder(tmp_path: Path) -> None:
    p = plan(_opts(command=["train.py", "-x"], trace=True, flight_recorder=True, log_dir=tmp_path), host="h",
             environ={"TORCH_FR_BUFFER_SIZE": ""})
    i = p.argv.index("--no-python")
    assert p.argv[i + 1:i + 5] == [sys.executable, "-m", "ml_debug", "trace"]
    assert p.argv[-3:] == ["--", "train.py", "-x"]
    assert p.env["TORCH_FR_BUFFER_SIZE"] == "2000"  # an empty value would hang init_process_group
    assert p.env["MLDEBUG_FR_DIR"] == str(tmp_path / "h" / "fr")
    with pytest.raises(UsageError):
        plan(_opts(command=["prog"], no_python=True, trace=True, log_dir=tmp_path), host="h")


def test_launch_refuses_a_used_log_dir(tmp_path: Path) -> None:
    p = plan(_opts(command=["t.py"], log_dir=tmp_path), host="h")
    prepare(p)
    with pytest.raises(UsageError):
        prepare(plan(_opts(command=["t.py"], log_dir=tmp_path), host="h"))
    with pytest.raises(UsageError):
        plan(_opts(command=[], log_dir=tmp_path), host="h")


def test_a_rank_stdout_line_teed_into_its_traceback_is_not_the_exception(tmp_path: Path) -> None:
    # torchrun --tee 3 writes a rank's stdout and stderr into one console: a stdout line can land
    # between the frames of the traceback torch prefixes with [rankN]: (seen in a real run).
    console = tmp_path / "console.log"
    console.write_text(
        "[vm:0]:rank 0: step 1 done (sum 4)\n"
        "[vm:2]:[rank2]: Traceback (most recent call last):\n"
        '[vm:2]:[rank2]:   File "/w/logs_worker.py", line 47, in <module>\n'
        "[vm:2]:[rank2]:     main()\n"
        '[vm:2]:[rank2]:   File "/w/logs_worker.py", line 39, in main\n'
        "[vm:2]:rank 2: step 1 done (sum 4)\n"
        '[vm:2]:[rank2]:     raise ValueError(f"bad batch on rank {rank}: shape mismatch")\n'
        "[vm:2]:[rank2]: ValueError: bad batch on rank 2: shape mismatch\n"
        "[vm:3]:rank 3: step 1 done (sum 4)\n")
    from ml_debug.logs.triage import triage

    v = triage([str(console)]).verdict
    assert v.primary is not None and v.primary.who.rank == 2, v.summary
    assert v.primary.message.startswith("ValueError: bad batch on rank 2"), v.primary.message


def test_a_launch_stopped_at_its_timeout_names_the_timeout() -> None:
    """tests/data/logs/launch_timeout/: a real `mldebug launch --nproc-per-node 2 --timeout 5` of a script that
    sleeps (paths rewritten to /shared/job/logs): the launcher stopped torchrun, whose SIGTERM traceback follows.
    The log says `--timeout`, launch's earlier name for --run-timeout: old logs are read as new ones."""
    report = triage([str(DATA / "launch_timeout")])
    p = report.verdict.primary
    assert report.verdict.status == "failure" and p is not None and p.kind == "launcher", report.verdict.summary
    assert "--run-timeout 5 s" in p.message and p.who.node == "vm" and p.time is not None


def test_only_consequences_never_claim_a_primary_failure(tmp_path: Path) -> None:
    """The same console without the launcher's line: torchrun's agent says it got SIGTERM (a stop from outside, the
    failure), then its own SIGTERM traceback; without that line too, only the traceback: a consequence."""
    node = DATA / "launch_timeout" / "vm"
    console = (node / "console.log").read_text()
    (tmp_path / "launch.json").write_text((node / "launch.json").read_text())
    for drop, stopped in ((("mldebug launch:",), True), (("mldebug launch:", "death signal"), False)):
        (tmp_path / "console.log").write_text("".join(line for line in console.splitlines(keepends=True)
                                                      if not any(d in line for d in drop)))
        v = triage([str(tmp_path)]).verdict
        if stopped:
            assert v.status == "failure" and v.primary is not None and v.primary.kind == "launcher", v.summary
            assert "the job was stopped from outside" in v.summary, v.summary
            continue
        assert v.status == "secondary-only" and v.basis is not None
        assert "primary" not in v.basis, v.basis
        assert v.summary.startswith("no primary failure found: vm failed only as a consequence"), v.summary


def test_a_rank_that_raised_and_then_aborted_while_exiting_failed_once() -> None:
    """Real torchrun logs (tests/data/logs/raise_then_sigabrt_at_exit/): rank 2 raised a ValueError, then
    gloo aborted its exit ("terminate called without an active exception"), so torchrun saw -6 (SIGABRT).
    A process ends once: one failure for rank 2, told by its exception, with the signal in its detail."""
    from ml_debug.logs.result import PRIMARY
    from ml_debug.logs.triage import triage
    from tests.conftest import REPO

    logs = REPO / "tests" / "data" / "logs" / "raise_then_sigabrt_at_exit"
    for paths in ([logs / "console.log"], [logs / "torchelastic"], [logs / "console.log", logs / "torchelastic"]):
        report = triage([str(p) for p in paths])
        v = report.verdict
        assert v.primary is not None and v.primary.who.rank == 2, (paths, v.summary)
        assert "ValueError: bad batch on rank 2" in v.primary.message, (paths, v.summary)
        assert not v.independent, (paths, v.summary)
        primary = [e for e in report.events if e.cls == PRIMARY and e.strong]
        assert [e.who.rank for e in primary] == [2], [(e.who, e.message) for e in primary]
    assert v.primary.detail["exit_code"] == -6  # torchrun's summary, kept with the exception


def test_lines_that_say_an_error_went_away_are_no_suspects(tmp_path: Path) -> None:
    """Lines of jobs that went on, as users posted them: huggingface_hub's retried request, wandb's network error
    resolved, a C++ exception's stack frame, the source code in a rich traceback's box. A line that only looks like
    a failure still is a suspect."""
    ok = ["'(ProtocolError('Connection aborted.', RemoteDisconnected('Remote end closed connection without "
          "response'))' thrown while requesting GET https://huggingface.co/api/models/x", "Retrying in 1s [Retry 1/5].",
          "wandb: Network error resolved after 0:01:10.030828, resuming normal operation.",
          "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 (0x7f5e2fb6c446 in libc10.so)",
          "│   242 │   │   │   # if the error files for the failed children exist          │", "{'loss': 0.52}"]
    path = tmp_path / "ok.log"
    path.write_text("\n".join(ok) + "\n")
    assert triage([str(path)]).verdict.status == "none"
    path.write_text("\n".join([*ok, "2026-11-28 04:18:40,186 ERROR trainer: step 12 failed"]) + "\n")
    v = triage([str(path)]).verdict
    assert v.status == "suspect" and v.primary is not None and "step 12 failed" in v.primary.message, v.summary
