"""The kernel-log reader on recorded text of each kind and format (tests/data/postmortem/: lines of this
machine's own dmesg in its three time formats, Xid, OOM-killer and hung-task lines as the NVIDIA driver
and Linux write them), and the node script run for real, as root and as a user without the right to
read the kernel log."""

from __future__ import annotations

import os
import shutil
import subprocess
from datetime import datetime, timezone
from pathlib import Path

from ml_debug.postmortem.kernel import parse_lines, parse_node_output, split_stamp
from ml_debug.postmortem.nodes import SCRIPT, parse_node
from tests.conftest import REPO, require

DATA = REPO / "tests" / "data" / "postmortem"


def _lines(name: str) -> list[str]:
    return (DATA / name).read_text().splitlines()


def _t(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()


def test_each_kind_in_dmesg_iso_with_its_meaning_pid_and_time() -> None:
    events = parse_lines(_lines("dmesg-iso.txt"), "node3")
    assert [e.kind for e in events] == ["segfault", "xid", "oom-kill", "hung-task"]
    segv, xid, oom, hung = events
    assert (segv.pid, segv.comm, segv.detail["object"]) == (16240, "python", "libc.so.6")
    assert segv.time == _t("2026-11-28T03:14:39") + 0.489367
    assert xid.describe() == "Xid 79 (GPU has fallen off the bus) on 0000:3b:00"
    assert (xid.pid, xid.comm, xid.detail["severity"]) == (4242, "python", "hardware")
    assert oom.describe() == "cgroup OOM killer killed pid 4343 (python, 65453 MiB resident)"
    assert hung.describe() == "task python:4444 blocked for more than 122 s" and hung.node == "node3"


def test_journalctl_short_iso_and_a_general_protection_fault() -> None:
    events = parse_lines(_lines("journalctl-short-iso.txt"), "gpu-node07")
    assert [(e.kind, e.pid) for e in events] == [("xid", 5151), ("oom-kill", 5252), ("segfault", 5353)]
    assert events[0].detail["meaning"].startswith("Double-bit") and events[0].time == _t("2026-11-28T03:20:11")
    assert events[1].detail["killer"] == "OOM killer" and events[1].comm == "pt_main_thread"
    assert events[2].describe() == "pt_data_worker[5353]: general protection fault in libtorch_cpu.so"
    assert events[0].message.startswith("NVRM: Xid")  # the host and "kernel:" prefix removed


def test_ctime_and_boot_clock_stamps_and_the_time_window() -> None:
    t_events = parse_lines(_lines("dmesg-T.txt"))
    assert [e.kind for e in t_events] == ["segfault", "xid"]
    assert t_events[0].time == datetime(2026, 11, 28, 3, 14, 39).timestamp()  # dmesg -T is local time
    plain = parse_lines(_lines("dmesg-plain.txt"))
    assert [(e.kind, e.time) for e in plain] == [("segfault", None), ("hung-task", None)]
    # only what happened while the job ran (a line without wall-clock time cannot be placed: kept)
    since, until = _t("2026-11-28T03:20:00"), _t("2026-11-28T03:21:00")
    assert [e.kind for e in parse_lines(_lines("dmesg-iso.txt"), since=since, until=until)] == ["xid", "oom-kill"]
    assert len(parse_lines(_lines("dmesg-plain.txt"), since=since, until=until)) == 2
    assert split_stamp("no stamp at all") == (None, "no stamp at all")


def test_a_node_without_the_right_to_read_is_said_not_an_error() -> None:
    log = parse_node_output((DATA / "node-unreadable.txt").read_text(), "node4")
    assert not log.readable and log.events == []
    assert log.reason == "dmesg: read kernel buffer failed: Operation not permitted"
    empty = parse_node_output("", "node5")
    assert not empty.readable and empty.reason == "the node printed no kernel log"


def test_the_node_script_for_real_as_root_and_as_nobody(tmp_path: Path) -> None:
    """SCRIPT as it runs on a node: this machine's kernel log as root; as nobody (kernel.dmesg_restrict=1
    here) the refusal, said. The dump part sends back the files of a prefix written since the start."""
    require(os.geteuid() == 0 and shutil.which("runuser"), "root and runuser")
    dump = tmp_path / "trace_3"
    dump.write_bytes(b"\x80\x04dump bytes")
    (tmp_path / "other_3").write_bytes(b"not a dump of this prefix")
    argv = ["sh", "-c", SCRIPT, "x", "0", str(tmp_path / "trace_")]
    root = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    got = parse_node(root.stdout, "here", since=None)
    assert got.kernel.readable and got.kernel.source in ("journalctl", "dmesg") and got.kernel.lines > 0
    assert got.dumps == {str(dump): b"\x80\x04dump bytes"}
    require(Path("/proc/sys/kernel/dmesg_restrict").read_text().strip() == "1", "kernel.dmesg_restrict=1")
    nobody = subprocess.run(["runuser", "-u", "nobody", "--", *argv], capture_output=True, text=True, timeout=60)
    got = parse_node(nobody.stdout, "here", since=None)
    assert not got.kernel.readable and "Operation not permitted" in (got.kernel.reason or "")


def test_dump_files_in_short_lines_and_one_cut_short() -> None:
    """srun cuts an output line at 1 KiB: a dump comes back in base64 lines up to an end mark."""
    import base64

    data = bytes(range(256)) * 20
    lines = base64.encodebytes(data).decode().splitlines()
    text = "\n".join(["@@node n1", "@@source dmesg", "[1.0] booted", "@@dump /tmp/trace_0", *lines, "@@end",
                      "@@dump /tmp/trace_1", *lines[:3]])
    got = parse_node(text, "n1", since=None)
    assert got.dumps == {"/tmp/trace_0": data} and got.kernel.lines == 1
    assert got.dump_errors == {"/tmp/trace_1": "cut short (the node's output ended before the file did)"}
