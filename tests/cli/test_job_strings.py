"""A job's strings on every channel a person reads (issue 41): one real process whose script is named
with a forged line, ESC, BEL and a newline, read by every command that shows it.

The name is ``forged\\nsuspect: rank 7 (node9, pid 1) in FAKE (fake.py:1)\\n\\e]0;TITLE\\a\\e[31mvil.py``:
printed raw, it sets the reader's terminal title and colour, and adds a line that reads as dump-stacks'
verdict. Every text output must show it as one visible string (``\\n``, ``\\e``, ``\\a``), never as a line of
its own; JSON keeps the exact name.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import mldebug, require, require_module, wait_in_function

FORGED = "suspect: rank 7 (node9, pid 1) in FAKE (fake.py:1)"
NAME = f"forged\n{FORGED}\n\x1b]0;TITLE\a\x1b[31mvil.py"
SHOWN = f"forged\\n{FORGED}\\n\\e]0;TITLE\\a\\e[31mvil.py"  # how every text output must show it
RUN_ID = f"run\x1b]0;T\a\n{FORGED}"  # the job's TORCHELASTIC_RUN_ID: the exporter's job_id label
RAW = ("\x1b", "\x07", "\x9b", "\r", "\b")
JOB = """\
import time


def job_main_loop():
    while True:
        time.sleep(0.05)


job_main_loop()
"""


@dataclass
class Job:
    pid: int
    dir: Path
    stderr: Path
    script: Path


def start_job(d: Path) -> tuple[subprocess.Popen[bytes], Job]:
    script = d / NAME
    script.write_text(JOB)
    err = d / "job.err"
    with open(err, "wb") as f:  # the job's own log: nothing mldebug does may write into it
        proc = subprocess.Popen([sys.executable, str(script)], cwd=d, stdin=subprocess.DEVNULL, stdout=f, stderr=f,
                                start_new_session=True,
                                env={**os.environ, "TORCHELASTIC_RUN_ID": RUN_ID, "RANK": "0", "WORLD_SIZE": "1"})
    wait_in_function(proc.pid, {"job_main_loop"}, innermost=False)
    return proc, Job(proc.pid, d, err, script)


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Job]:
    proc, j = start_job(tmp_path_factory.mktemp("strings"))
    yield j
    proc.kill()
    proc.wait(timeout=15)


def problems(text: str, where: str, shown: str | None = SHOWN) -> list[str]:
    """What lets the name drive the terminal or forge a line; `shown`: what must be there instead."""
    found = [f"{where} lets {', '.join(repr(c) for c in RAW if c in text)} through"] if any(c in text for c in RAW) \
        else []
    for line in text.splitlines():
        if FORGED in line and not line.split(FORGED)[0].endswith("\\n"):
            found.append(f"{where} forges a line: {line!r}")
    if shown is not None and shown not in text:
        found.append(f"{where} does not show {shown!r}: {text[-800:]!r}")
    return found


def test_dump_stacks_tree_table_and_verdict_show_the_name_as_one_string(job: Job) -> None:
    proc = mldebug("dump-stacks", "--local", "--pid", str(job.pid), "--all-threads", timeout=180)
    assert proc.returncode == 0, proc.stderr
    found = problems(proc.stdout, "dump-stacks") + problems(proc.stderr, "dump-stacks' stderr", None)
    assert proc.stdout.count(SHOWN) >= 3, proc.stdout  # the tree, the group table, the verdict
    verdict = proc.stdout.rstrip("\n").splitlines()[-1]
    assert verdict.startswith("no suspect: all 1 rank are in job_main_loop (" + SHOWN), verdict
    assert not found, "\n".join(found)
    doc = json.loads(mldebug("dump-stacks", "--local", "--pid", str(job.pid), "--json", timeout=180).stdout)
    files = {f["filename"] for p in doc["result"]["processes"] for s in p["samples"] if s["ok"]
             for t in s["threads"] for f in t["frames"]}
    assert str(job.script) in files, files  # JSON keeps the exact name


def test_the_attach_prompt_shows_frame_lines_visibly(job: Job, debuggers_alone: None) -> None:
    require_module("debugpy", "mldebug attach injects debugpy")
    proc = mldebug("attach", "--pid", str(job.pid), input="bt\nup\ndown\nq\n", timeout=180)
    assert proc.returncode == 0, proc.stderr
    found = problems(proc.stdout, "attach's prompt") + problems(proc.stderr, "attach's stderr", None)
    assert "job_main_loop  " + SHOWN.rsplit("/", 1)[-1] in proc.stdout, proc.stdout
    assert not found, "\n".join(found)


def test_attaching_writes_nothing_into_the_jobs_own_stderr(tmp_path: Path, debuggers_alone: None) -> None:
    """debugpy's injected server warns about frozen modules and an unimported threading module on the
    process's stderr: the job's log. A fresh process, so that it is debugpy's first visit."""
    require_module("debugpy", "mldebug attach injects debugpy")
    proc, j = start_job(tmp_path)
    try:
        before = j.stderr.read_bytes()
        out = mldebug("attach", "--pid", str(j.pid), "--eval", "1 + 1", timeout=180)
        assert out.returncode == 0, out.stderr
        assert proc.poll() is None
        assert j.stderr.read_bytes() == before, j.stderr.read_text(errors="replace")
    finally:
        proc.kill()
        proc.wait(timeout=15)


def test_the_watch_bundle_summary_and_watch_stderr(job: Job, tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    proc = mldebug("watch", "--pid", str(job.pid), "--now", "--samples", "1", "--interval", "1", "--out-dir", str(out),
                   timeout=180)
    summaries = list(out.rglob("summary.md"))
    assert summaries, (proc.returncode, proc.stderr[-1500:])
    md = summaries[0].read_text()
    found = problems(md, "summary.md") + problems(proc.stderr, "watch's stderr") + \
        problems(proc.stdout, "watch's stdout", None)
    assert not found, "\n".join(found)


def test_exporter_once_label_values_and_stderr(job: Job) -> None:
    """Two jobs, so that the exporter's stderr names each event's job (`[job ID]`): the job id, from the
    rank's TORCHELASTIC_RUN_ID, carries ESC, BEL and the forged line."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True,
                             env={**os.environ, "TORCHELASTIC_RUN_ID": "plain", "RANK": "0", "WORLD_SIZE": "1"})
    try:
        proc = mldebug("exporter", "--once", "--pid", str(job.pid), "--pid", str(other.pid), "--interval", "0.5",
                       timeout=180)
    finally:
        other.kill()
        other.wait(timeout=15)
    assert proc.returncode in (0, 1), proc.stderr
    series = [line for line in proc.stdout.splitlines() if line.startswith("mldebug_rank_")]
    assert series and all("job_id=" in line for line in series), proc.stdout[-2000:]
    found = problems(proc.stdout, "the exporter's metrics", None) + \
        problems(proc.stderr, "the exporter's stderr", "[job run\\e]0;T\\a\\n" + FORGED + "]")
    # the label value, as Prometheus reads it back: the visible text, not the job's control characters
    assert 'job_id="run\\\\e]0;T\\\\a\\\\n' + FORGED + '"' in proc.stdout, series[:3]
    assert not found, "\n".join(found)


def test_logs_names_a_source_file_with_a_forged_name_visibly(tmp_path: Path) -> None:
    d = tmp_path / "run"
    d.mkdir()
    (d / (NAME + ".log")).write_text("[rank0]: Traceback (most recent call last):\n"
                                     '[rank0]:   File "t.py", line 3, in <module>\n'
                                     "[rank0]: RuntimeError: boom\n")
    proc = mldebug("logs", str(d), timeout=120)
    found = problems(proc.stdout, "logs", SHOWN + ".log") + problems(proc.stderr, "logs' stderr", None)
    assert not found, "\n".join(found)


def test_top_shows_the_job_without_its_control_characters(job: Job) -> None:
    proc = mldebug("top", "--once", "--pattern", "vil[.]py", timeout=120)
    assert proc.returncode in (0, 1), proc.stderr
    assert " rank" in proc.stdout, proc.stdout
    found = problems(proc.stdout, "top", None) + problems(proc.stderr, "top's stderr", None)
    assert not found, "\n".join(found)


def test_core_bt_names_a_core_and_its_frames_visibly(tmp_path: Path) -> None:
    """A real core of a Python process that crashed in a script with the forged name."""
    require(os.path.exists("/usr/bin/gdb") or os.path.exists("/bin/gdb"), "gdb")
    d = tmp_path / "cores"
    d.mkdir()
    script = d / NAME
    script.write_text("import ctypes, resource\n"
                      "resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))\n"
                      "def crash_here():\n    ctypes.string_at(0)\n"
                      "crash_here()\n")
    subprocess.run([sys.executable, str(script)], cwd=d, capture_output=True, timeout=60)
    cores = [p for p in d.iterdir() if p.name.startswith("core")]
    require(cores, "a core file (kernel.core_pattern 'core', as on this machine)")
    cores[0].rename(d / ("core." + NAME))
    proc = mldebug("core-bt", str(d), timeout=180)
    found = problems(proc.stdout, "core-bt", "core." + SHOWN) + problems(proc.stderr, "core-bt's stderr", None)
    assert not found, "\n".join(found)
