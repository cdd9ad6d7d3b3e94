"""NicerTrace with threads and forks: whole lines, each thread its own tag and ring, and nothing of
mldebug's own in the user's trace."""

from __future__ import annotations

import re
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from ml_debug.core import rankvars
from ml_debug.nicertrace import NicerTrace
from ml_debug.tracing.filter import TraceFilter
from ml_debug.tracing.options import MAX_RING, TraceOptions
from ml_debug.tracing.threads import KEEP_FINISHED
from tests.conftest import import_from_source, mldebug

CALLS = 1000  # per thread

WORKERS = textwrap.dedent(f'''
    import threading

    def f(i):
        return i

    def work():
        for i in range({CALLS}):
            f(i)

    def main(together):
        ts = [threading.Thread(target=work, name=f"w{{k}}") for k in range(2)]
        for t in ts:
            t.start()
            if not together:
                t.join()  # the next thread usually gets the finished one's ident
        for t in ts:
            t.join()
''')

EVENT = re.compile(r"^\d+:\d\d:\d\d\.\d{3} (\{w[01]\} )?(--> \S+:\d+ \S+|    \S+\.py:\d+: .*)$")


@pytest.fixture
def workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    yield import_from_source(tmp_path, monkeypatch, "nt_workers", WORKERS)
    sys.modules.pop("nt_workers", None)


def _per_thread(lines: list[str], needle: str) -> dict[str, int]:
    return {tag: sum(1 for x in lines if f"{{{tag}}} " in x and needle in x) for tag in ("w0", "w1")}


@pytest.mark.parametrize("together", [True, False], ids=["concurrent", "ident-reused"])
def test_stream_lines_are_whole_and_tagged_with_their_own_thread(tmp_path, workers, together):
    """Both threads write while the watchdog flushes (as often as it can): every line intact, none
    lost, and a thread that reuses a finished thread's ident still carries its own name."""
    tracer = NicerTrace(count=0, packages_to_include="uninstalled", out_dir=tmp_path / "out", flush_interval=0.001)
    tracer.runfunc(workers.main, together)
    assert tracer.path is not None
    raw = Path(tracer.path).read_bytes()
    assert b"\0" not in raw
    head, *lines = raw.decode().splitlines()
    assert head.startswith("# nicertrace ")
    assert [x for x in lines if not EVENT.match(x)] == []
    assert _per_thread(lines, "--> ") == {"w0": CALLS + 1, "w1": CALLS + 1}  # work() and each f(i)
    assert _per_thread(lines, "return i") == {"w0": CALLS, "w1": CALLS}


def test_each_thread_keeps_its_own_ring(tmp_path, workers):
    """Ring mode: a thread started after another finished (same ident, usually) gets its own ring."""
    tracer = NicerTrace(count=0, packages_to_include="uninstalled", out_dir=tmp_path / "out", ring=50)
    tracer.runfunc(workers.main, False)
    assert tracer.path is not None
    text = Path(tracer.path).read_text()
    sections = re.findall(r"^# thread (\S+) ident=\d+ last (\d+) events$", text, re.M)
    assert sections == [("{w0}", "50"), ("{w1}", "50"), ("{main}", sections[-1][1])]
    w1 = text.split("# thread {w1}")[1].split("# thread {main}")[0]
    assert "{w0}" not in w1 and w1.count("{w1} ") == 50


def test_ring_dumps_keep_only_the_last_finished_threads(tmp_path, workers):
    """Rings of finished threads are dumped (what a worker did last), but a program that starts
    thread after thread does not keep every ring forever."""
    def run():
        for k in range(KEEP_FINISHED + 8):
            t = threading.Thread(target=workers.f, args=(k,), name=f"t{k}")
            t.start()
            t.join()

    tracer = NicerTrace(count=0, packages_to_include="uninstalled", out_dir=tmp_path / "out", ring=5)
    tracer.runfunc(run)
    assert tracer.path is not None
    names = re.findall(r"^# thread \{(\w+)\} ident=", Path(tracer.path).read_text(), re.M)
    assert names[-1] == "main" and "t0" not in names
    assert [f"t{k}" for k in range(8, KEEP_FINISHED + 8)] == [x for x in names if x not in ("main", "t7")]


def test_ring_size_has_a_maximum(tmp_path):
    """A ring too big for a deque (or for memory) is a usage error, before any file is made."""
    out = tmp_path / "r1"
    (tmp_path / "t.py").write_text("print('ran')\n")
    for ring in (str(MAX_RING + 1), "99999999999999999999"):
        r = mldebug("trace", "--ring", ring, "-o", str(out), "--", "t.py", cwd=tmp_path)
        assert r.returncode == 2, r.stdout + r.stderr
        assert r.stderr.startswith("mldebug: error: ") and "\nhint: " in r.stderr
        assert "Traceback" not in r.stderr and "ran" not in r.stdout
        assert not out.exists()
    with pytest.raises(ValueError, match=f"1 to {MAX_RING}"):
        TraceOptions(ring=MAX_RING + 1)
    assert TraceOptions(ring=MAX_RING).ring == MAX_RING


def test_mldebug_helpers_are_never_traced():
    """The rank lookup runs inside the traced program (at start and at each fork)."""
    flt = TraceFilter(None, (), ())
    assert flt.kind(rankvars.__file__, "ml_debug.core.rankvars") is None


FORKS = textwrap.dedent('''
    import os

    def step(i):
        return i + 1

    for k in range(2):
        pid = os.fork()
        if pid == 0:
            for i in range(20):
                step(i)
            os._exit(0)  # as multiprocessing's workers end: no atexit, no flush
        os.waitpid(pid, 0)
    step(100)
''')


def test_fork_keeps_the_tracers_work_out_and_the_childs_lines_in(tmp_path):
    """--everything: neither the parent's nor a child's trace holds the tracer's own work at the fork
    (the rank lookup, opening the child's file, starting its watchdog), and a child that ends with
    os._exit has all its lines."""
    (tmp_path / "fk.py").write_text(FORKS)
    out = tmp_path / "fk"
    r = mldebug("trace", "--everything", "-o", str(out), "--", "fk.py", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    files = {f: f.read_text().splitlines() for f in sorted(out.glob("trace-*.txt"))}
    assert len(files) == 3
    children = [lines for lines in files.values() if "forked_from=" in lines[0]]
    [parent] = [lines for lines in files.values() if "forked_from=" not in lines[0]]
    user = parent[next(i for i, x in enumerate(parent) if "fk.py:1 <module>" in x):]  # after runpy's set-up
    own = re.compile(r"ml_debug|rankvars|posixpath|_weakrefset|--> threading:|--> os:")
    for lines in (user, *children):
        assert [x for x in lines if own.search(x)] == []
    assert len(children) == 2
    for lines in children:
        assert sum("--> " in x and x.endswith(" step") for x in lines) == 20
    assert sum("--> " in x and x.endswith(" step") for x in parent) == 1
