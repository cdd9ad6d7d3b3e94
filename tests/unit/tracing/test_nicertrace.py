"""NicerTrace: filter modes, output format, per-process files, counts equal to trace.Trace's."""

from __future__ import annotations

import inspect
import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import threading
import trace
from pathlib import Path

import pytest

from ml_debug import nicertrace
from ml_debug.nicertrace import NicerTrace, detect_rank, format_elapsed, trace_file_name
from tests.conftest import import_from_source, require, require_module

STAMP = r"\d+:\d\d:\d\d\.\d{3}"
CALL = re.compile(rf"^(?P<ts>{STAMP} )?(?P<pid>\[pid \d+\] )?(?P<thr>\{{[^}}]+\}} )?--> (?P<mod>\S+):(?P<first>\d+) (?P<fn>\S+)$")
LINE = re.compile(rf"^(?P<ts>{STAMP} )?(?P<pid>\[pid \d+\] )?(?P<thr>\{{[^}}]+\}} )?    (?P<file>\S+):(?P<line>\d+): (?P<src>.*)$")

USER_MODULE = '''
import json
import rich.markup


def to_json(x):
    y = {"x": x}
    return json.dumps(y)


def hosts():
    return rich.markup.escape("[n1]")


def work():
    a = to_json(1)
    b = hosts()
    return a, b
'''


@pytest.fixture
def usermod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A module outside site-packages and the stdlib that calls into both."""
    yield import_from_source(tmp_path, monkeypatch, "nt_usermod", USER_MODULE)
    sys.modules.pop("nt_usermod", None)


def _traced(tmp_path: Path, func, **kw) -> list[str]:
    out = tmp_path / "out"
    kw.setdefault("count", 0)
    tracer = NicerTrace(out_dir=out, **kw)
    tracer.runfunc(func)
    assert tracer.path is not None and Path(tracer.path).parent == out
    lines = Path(tracer.path).read_text().splitlines()
    assert lines[0].startswith("# nicertrace ")
    return lines[1:]


def _called_modules(lines: list[str]) -> set[str]:
    """Dotted names of the modules called; your own code is named by its file: its stem here."""
    mods = {m.group("mod") for m in map(CALL.match, lines) if m}
    return {Path(m).stem if m.endswith(".py") else m for m in mods}


# ------------------------------------------------------------------ filters


def test_everything_traced_with_none(tmp_path, usermod):
    mods = _called_modules(_traced(tmp_path, usermod.work, packages_to_include=None))
    assert {"nt_usermod", "json", "json.encoder", "rich.markup"} <= mods


@pytest.mark.parametrize("packages", ["uninstalled", [], ["uninstalled"]])
def test_uninstalled_traces_only_own_code(tmp_path, usermod, packages):
    # The seed iterated "uninstalled" as characters and ignored nothing.
    mods = _called_modules(_traced(tmp_path, usermod.work, packages_to_include=packages))
    assert mods == {"nt_usermod"}


def test_listed_stdlib_package_is_traced_with_submodules(tmp_path, usermod):
    mods = _called_modules(_traced(tmp_path, usermod.work, packages_to_include=["json"]))
    assert {"nt_usermod", "json", "json.encoder"} <= mods
    assert "rich.markup" not in mods


def test_listed_site_package_is_traced(tmp_path, usermod):
    mods = _called_modules(_traced(tmp_path, usermod.work, packages_to_include=["rich"]))
    assert {"nt_usermod", "rich.markup"} <= mods
    assert not {"json", "json.encoder"} & mods


def test_single_package_as_string_is_a_name_not_characters(tmp_path, usermod):
    mods = _called_modules(_traced(tmp_path, usermod.work, packages_to_include="json"))
    assert "json" in mods and "rich.markup" not in mods


@pytest.mark.parametrize("as_str", [True, False])
def test_single_ignoredir_is_honoured(tmp_path, usermod, as_str):
    # The seed overrode a one-element ignoredirs list (len > 1 check): everything was traced.
    src = str(Path(usermod.__file__).parent)
    mods = _called_modules(_traced(tmp_path, usermod.work, ignoredirs=src if as_str else [src]))
    assert "nt_usermod" not in mods
    assert {"json", "rich.markup"} <= mods  # packages_to_include=None: the rest is still traced


def test_ignoredirs_and_packages_combine(tmp_path, usermod):
    json_dir = os.path.dirname(json.__file__)
    mods = _called_modules(_traced(tmp_path, usermod.work, packages_to_include=["json", "rich"],
                                   ignoredirs=[json_dir]))
    assert mods == {"nt_usermod", "rich.markup"}


def test_ignoremods_matches_dotted_names_and_submodules(tmp_path, usermod):
    mods = _called_modules(_traced(tmp_path, usermod.work, ignoremods=["json"]))
    assert "json" not in mods and "json.encoder" not in mods
    assert {"nt_usermod", "rich.markup"} <= mods


def test_bad_package_names_are_rejected():
    with pytest.raises(ValueError, match="top-level package"):
        NicerTrace(packages_to_include=["not a name"])
    with pytest.raises(TypeError):
        NicerTrace(packages_to_include=[3])
    with pytest.raises(ValueError, match="ring"):
        NicerTrace(ring=0)
    with pytest.raises(ValueError, match="idle_dump"):
        NicerTrace(idle_dump=5)


# ------------------------------------------------------------------ output format


def test_call_and_line_format(tmp_path, usermod):
    lines = _traced(tmp_path, usermod.work, packages_to_include=["json"])
    assert lines and all(CALL.match(x) or LINE.match(x) for x in lines), lines
    calls = [CALL.match(x) for x in lines if CALL.match(x)]
    by_fn = {m.group("fn"): m for m in calls}
    # Your code by its file, installed code by its full dotted module name; the function's first
    # line, its qualified name.
    assert by_fn["to_json"].group("mod") == usermod.__file__
    assert int(by_fn["to_json"].group("first")) == usermod.to_json.__code__.co_firstlineno
    enc = by_fn["JSONEncoder.encode"] if sys.version_info >= (3, 11) else by_fn["encode"]
    assert enc.group("mod") == "json.encoder"
    assert int(enc.group("first")) == json.JSONEncoder.encode.__code__.co_firstlineno
    # Line lines: file basename, line number and that line's source.
    first = usermod.to_json.__code__.co_firstlineno
    assert f"    nt_usermod.py:{first + 1}: y = {{\"x\": x}}" in [LINE.match(x).group(0)[len(LINE.match(x).group("ts") or ""):]
                                                          for x in lines if LINE.match(x)]
    # Every line carries the elapsed time; it never goes backwards.
    stamps = [(CALL.match(x) or LINE.match(x)).group("ts") for x in lines]
    assert all(stamps)
    assert stamps == sorted(stamps, key=lambda s: tuple(int(p) for p in re.split(r"[:.]", s.strip())))


@pytest.mark.parametrize("count", [0, 1])
def test_timestamps_in_every_mode(tmp_path, usermod, count):
    # The seed stamped only the trace+count mode.
    lines = _traced(tmp_path, usermod.work, packages_to_include="uninstalled", count=count)
    assert all(re.match(STAMP + " ", x) for x in lines)


def test_no_timestamps_when_timing_off(tmp_path, usermod):
    lines = _traced(tmp_path, usermod.work, packages_to_include="uninstalled", timing=False)
    assert lines and not any(re.match(STAMP, x) for x in lines)
    assert all(CALL.match(x) or LINE.match(x) for x in lines)


def test_log_pids(tmp_path, usermod):
    lines = _traced(tmp_path, usermod.work, packages_to_include="uninstalled", log_pids=True)
    assert lines and all(f"[pid {os.getpid()}] " in x for x in lines)


def test_threads_are_marked(tmp_path, usermod):
    def run():
        t = threading.Thread(target=usermod.work, name="loader")
        t.start()
        t.join()
        usermod.work()

    lines = _traced(tmp_path, run, packages_to_include="uninstalled")
    tagged = [x for x in lines if "{loader} " in x]
    assert any(f"--> {usermod.__file__}:" in x and "work" in x for x in tagged)
    assert any(f"--> {usermod.__file__}:" in x and "{" not in x for x in lines)  # the main thread's own calls


def test_stdout_when_no_out_dir(capsys, usermod):
    NicerTrace(count=0, packages_to_include="uninstalled").runfunc(usermod.work)
    out = capsys.readouterr().out.splitlines()
    assert any(CALL.match(x) and "to_json" in x for x in out)


def test_context_manager_and_counts(tmp_path, usermod):
    tracer = NicerTrace(count=1, trace=0, packages_to_include="uninstalled")
    with tracer:
        usermod.work()
    first = usermod.to_json.__code__.co_firstlineno
    assert tracer.counts[(usermod.__file__, first + 1)] == 1
    assert all(k[0] == usermod.__file__ for k in tracer.counts)


# ------------------------------------------------------------------ file names and ranks


def test_file_name_and_rank(monkeypatch):
    for var in nicertrace.RANK_VARS:
        monkeypatch.delenv(var, raising=False)
    assert detect_rank() == "na"
    host = socket.gethostname()
    assert trace_file_name() == f"trace-{host}-na-{os.getpid()}.txt"
    monkeypatch.setenv("SLURM_PROCID", "7")
    assert detect_rank() == "7"
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "9")
    assert detect_rank() == "7"  # SLURM_PROCID comes first
    monkeypatch.setenv("RANK", "3")
    assert trace_file_name(pid=42, host="node-a") == "trace-node-a-3-42.txt"


def test_rank_in_written_file_name(tmp_path, usermod, monkeypatch):
    monkeypatch.setenv("RANK", "5")
    tracer = NicerTrace(count=0, out_dir=tmp_path, packages_to_include="uninstalled")
    tracer.runfunc(usermod.work)
    assert Path(tracer.path).name == f"trace-{socket.gethostname()}-5-{os.getpid()}.txt"
    assert "rank=5 " in Path(tracer.path).read_text().splitlines()[0]


def test_format_elapsed():
    assert format_elapsed(0) == "0:00:00.000"
    assert format_elapsed(3723.4567) == "1:02:03.456"


# ------------------------------------------------------------------ same counts as trace.Trace


def _loop(x, y):
    c = x
    for _ in range(5):
        c += y
    return c


def _gen(n):
    c = 5
    for i in range(n):
        yield i + c


def _calls_gen():
    k = 0
    for i in _gen(10):
        k += i
    return k


def _comprehension():
    k = 10
    return [_loop(i, 1) for i in range(k)]


def _raises():
    try:
        {}["missing"]
    except KeyError:
        return 1


def _one_line_loop():
    t = 0
    for i in range(4): t += i  # noqa: E701 (a backward jump to the same line)
    return t


@pytest.mark.parametrize("func", [_loop, _calls_gen, _comprehension, _raises, _one_line_loop])
def test_counts_equal_standard_trace(func):
    args = (2, 3) if func is _loop else ()
    std = trace.Trace(count=1, trace=0)
    nice = NicerTrace(count=1, trace=0)
    old = sys.gettrace()
    try:
        assert std.runfunc(func, *args) == nice.runfunc(func, *args)
    finally:
        sys.settrace(old)
    assert nice.results().counts == std.results().counts
    assert nice.counts  # not vacuous


STDLIB_CASES = """
import sys, trace, unittest
import test.test_trace as tt
from ml_debug.nicertrace import NicerTrace

tt.Trace = trace.Trace = NicerTrace
suite = unittest.TestSuite()
for name in ("TestLineCounts", "TestRunExecCounts", "TestFuncs", "TestCallers", "TestCoverage", "Test_Ignore"):
    suite.addTests(unittest.defaultTestLoader.loadTestsFromTestCase(getattr(tt, name)))
result = unittest.TextTestRunner(stream=sys.stderr, verbosity=0).run(suite)
print(result.testsRun, int(result.wasSuccessful()))
for _, e in result.failures + result.errors:
    print(e, file=sys.stderr)
"""


def test_standard_library_test_trace_cases(tmp_path):
    """CPython's own Lib/test/test_trace.py counting and ignore cases, NicerTrace substituted.

    In a fresh interpreter: in the test process, objects earlier tests left behind (torch, hypothesis, ...)
    had their finalizers recorded by the callers cases, and the cases took 15x as long as alone."""
    require_module("test.test_trace", "CPython's own test package (Debian: libpython3-testsuite)")
    # cwd: TestCoverage writes TESTFN there
    proc = subprocess.run([sys.executable, "-c", STDLIB_CASES], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run, ok = map(int, proc.stdout.split()[-2:])
    assert run >= 15
    assert ok, proc.stderr[-3000:]


def _other_pythons() -> list[str]:
    """Python 3.12+ interpreters on this machine (MLDEBUG_PYTHON312, pyenv or PATH), to exercise
    sys.monitoring."""
    import shutil

    if os.environ.get("MLDEBUG_PYTHON312"):  # tests/run.sh names the one it found or installed
        return [os.environ["MLDEBUG_PYTHON312"]]
    found = []
    for v in ("3.12", "3.13", "3.14"):
        pyenv = sorted(Path("/root/.pyenv/versions").glob(f"{v}.*/bin/python{v}")) \
            if Path("/root/.pyenv/versions").is_dir() else []
        exe = str(pyenv[-1]) if pyenv else shutil.which(f"python{v}")
        if exe:
            found.append(exe)
    return found[-1:]  # the newest is enough: each run costs ~10-20 s


MONITORING_CHECK = textwrap.dedent("""
    import sys, unittest, trace, os, tempfile, json
    sys.path.insert(0, sys.argv[1])
    from ml_debug.nicertrace import NicerTrace
    assert NicerTrace(count=1).backend == "monitoring"
    import test.test_trace as tt
    tt.Trace = trace.Trace = NicerTrace
    os.chdir(tempfile.mkdtemp())
    suite = unittest.TestSuite()
    for name in ("TestLineCounts", "TestRunExecCounts", "TestFuncs", "TestCallers", "TestCoverage"):
        suite.addTests(unittest.defaultTestLoader.loadTestsFromTestCase(getattr(tt, name)))
    r = unittest.TextTestRunner(verbosity=0).run(suite)
    assert r.wasSuccessful()
    def work():
        return json.dumps({"a": 1})
    t = NicerTrace(count=0, packages_to_include="uninstalled", out_dir=".", ring=50)
    t.runfunc(work)
    text = open(t.path).read()
    assert "reason=end" in text and " work" in text and "json.encoder" not in text, text
    t = NicerTrace(count=0, packages_to_include=["json"], out_dir="j")
    t.runfunc(work)
    text = open(t.path).read()
    assert "--> json.encoder:" in text, text
    print("MONITORING-OK", r.testsRun)
""")


@pytest.mark.parametrize("python", _other_pythons() or [None])
def test_sys_monitoring_backend_on_newer_python(python, tmp_path):
    """On 3.12+ NicerTrace uses sys.monitoring: the same stdlib cases must pass there too."""
    import subprocess

    require(python, "a Python 3.12+ interpreter for the sys.monitoring backend (MLDEBUG_PYTHON312, pyenv or "
                    "PATH; tests/run.sh finds or installs one)")
    repo = str(Path(nicertrace.__file__).resolve().parents[1])
    script = tmp_path / "monitoring_check.py"
    script.write_text(MONITORING_CHECK)
    p = subprocess.run([python, str(script), repo], capture_output=True, text=True, timeout=120)
    require("No module named 'test" not in p.stderr, f"CPython's test package in {python}")
    assert p.returncode == 0 and "MONITORING-OK" in p.stdout, p.stdout + p.stderr


def test_import_is_standard_library_only():
    """Users import nicertrace directly: it must not pull torch, rich or mldebug's other modules,
    only its own parts in ml_debug.tracing (whose package import is cheap)."""
    import subprocess

    repo = str(Path(nicertrace.__file__).resolve().parents[1])
    code = (f"import sys; sys.path.insert(0, {repo!r}); before = set(sys.modules); "
            "import ml_debug.nicertrace; print('\\n'.join(sorted(set(sys.modules) - before)))")
    p = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    loaded = set(p.stdout.split())
    ours = {m for m in loaded if m.split(".")[0] == "ml_debug"}
    assert "ml_debug.nicertrace" in ours and "ml_debug.tracing.backends" in ours
    # its own parts, and the one dependency-free list of launcher rank variables
    allowed = {"ml_debug", "ml_debug.nicertrace", "ml_debug.tracing", "ml_debug.core", "ml_debug.core.rankvars"}
    assert all(m in allowed or m.startswith("ml_debug.tracing.") for m in ours), ours
    assert not {"ml_debug.tracing.tail", "ml_debug.tracing.run", "ml_debug.core.output"} & ours
    stdlib = set(sys.stdlib_module_names)
    assert {m.split(".")[0] for m in loaded - ours} <= stdlib, sorted(loaded - ours)
    # Source level too: every part imports only the standard library and its siblings.
    for name in ours:
        src = inspect.getsource(sys.modules[name] if name in sys.modules else __import__(name, fromlist=["_"]))
        tops = {m.split(".")[0] for m in re.findall(r"^\s*(?:from|import) (\S+)", src, re.M)}
        assert tops <= stdlib | {"ml_debug"}, (name, tops - stdlib)


# ------------------------------------------------------------------ call-line locations (as in the seed)


def test_user_module_call_lines_carry_its_full_path(tmp_path, usermod):
    """Code outside site-packages and the standard library is named by its file, as __main__ is;
    installed and standard-library code keeps its dotted module name."""
    lines = _traced(tmp_path, usermod.work, packages_to_include=["json", "rich"])
    calls = {m.group("fn"): m for m in map(CALL.match, lines) if m}
    assert calls["to_json"].group("mod") == usermod.__file__
    assert os.path.isabs(calls["to_json"].group("mod"))
    assert int(calls["to_json"].group("first")) == usermod.to_json.__code__.co_firstlineno
    assert calls["escape"].group("mod") == "rich.markup"
    enc = calls["JSONEncoder.encode"] if sys.version_info >= (3, 11) else calls["encode"]
    assert enc.group("mod") == "json.encoder"


# ------------------------------------------------------------------ the seed's line format

SEED_CALL = re.compile(r"^(?P<pid>\d+ )? (?P<where>\S+):(?P<first>\d+) (?P<fn>\S+)$")
SEED_LINE = re.compile(r"^(?P<pid>\d+ )?(?P<ts>\d+:\d\d:\d\d )?(?P<base>[^\s:]+):(?P<line> *\d+): (?P<src>.*)$")


def _seed_events(lines: list[str]) -> tuple[list[re.Match[str]], list[re.Match[str]]]:
    events = [x for x in lines if not x.startswith("#")]
    calls = [m for m in map(SEED_CALL.match, events) if m]
    body = [m for m in map(SEED_LINE.match, events) if m]
    assert len(calls) + len(body) == len(events), [x for x in events if not (SEED_CALL.match(x) or SEED_LINE.match(x))]
    return calls, body


@pytest.mark.parametrize("ring", [None, 10_000])
def test_seed_line_format(tmp_path, usermod, ring):
    lines = _traced(tmp_path, usermod.work, packages_to_include=["json"], line_format="seed", ring=ring)
    calls, body = _seed_events(lines)
    by_fn = {m.group("fn"): m for m in calls}
    # Calls: a leading space, no time stamp, the unqualified function name; user code by its path.
    assert by_fn["to_json"].group("where") == usermod.__file__
    assert int(by_fn["to_json"].group("first")) == usermod.to_json.__code__.co_firstlineno
    assert by_fn["encode"].group("where") == "json.encoder"
    assert not any(m.group("pid") for m in calls)
    # Lines: H:MM:SS, the file's basename, the number right-aligned in 6, the source as written.
    first = usermod.to_json.__code__.co_firstlineno
    assert f"nt_usermod.py:{first + 1:>6}:     y = {{\"x\": x}}" in [m.group(0)[len(m.group("ts")):] for m in body]
    assert all(m.group("ts") and len(m.group("line")) == 6 for m in body)
    assert not any("{" in x.split(" ", 1)[0] for x in lines)  # no thread tags in the seed's format


def test_seed_line_format_pids_and_no_timing(tmp_path, usermod):
    lines = _traced(tmp_path, usermod.work, packages_to_include="uninstalled", line_format="seed",
                    log_pids=True, timing=False)
    calls, body = _seed_events(lines)
    assert calls and body
    assert all(m.group("pid") == f"{os.getpid()} " for m in calls + body)
    assert not any(m.group("ts") for m in body)


def test_seed_line_format_matches_the_seed_tracer_output(tmp_path, usermod, capsys):
    """Side by side with a tracer that prints the seed's way (trace.Trace's hooks overridden)."""

    class SeedStyle(trace.Trace):
        def globaltrace_lt(self, frame, why, arg):  # the seed's call line: " where:first name"
            if why == "call" and frame.f_globals.get("__file__") == usermod.__file__:
                print(f" {frame.f_globals['__file__']}:{frame.f_code.co_firstlineno} {frame.f_code.co_name}")
                return self.localtrace
            return None

        def localtrace_trace_and_count(self, frame, why, arg):
            if why == "line":
                name, n = frame.f_code.co_filename, frame.f_lineno
                print(f"{os.path.basename(name)}:{n:>6}: {trace.linecache.getline(name, n)}", end="")
            return self.localtrace

    SeedStyle(count=1, trace=1).runfunc(usermod.work)
    expected = capsys.readouterr().out.splitlines()
    got = _traced(tmp_path, usermod.work, packages_to_include="uninstalled", line_format="seed", timing=False)
    assert got == expected and len(expected) >= 9  # 3 calls, 6 lines


def test_bad_line_format_is_rejected():
    with pytest.raises(ValueError, match="line_format"):
        NicerTrace(line_format="fancy")


# ------------------------------------------------------------------ forked children

FORK_HANG = textwrap.dedent('''
    import os, sys
    sys.path.insert(0, sys.argv[1])
    from ml_debug.nicertrace import NicerTrace

    def child_work(n):
        return sum(range(n))

    def main():
        pid = os.fork()
        if pid == 0:
            child_work(10)
            with open(sys.argv[3]) as f:  # a FIFO: the child hangs until the test has seen its events
                f.read()
            os._exit(0)  # as multiprocessing's forked workers end: no atexit, no final flush
        os.waitpid(pid, 0)

    NicerTrace(count=0, packages_to_include="uninstalled", out_dir=sys.argv[2]).runfunc(main)
''')


def test_forked_child_stream_reaches_disk_while_it_hangs(tmp_path):
    """Stream mode: a forked child has its own flusher, so a hung worker's last lines are on disk."""
    import subprocess
    import time

    repo = str(Path(nicertrace.__file__).resolve().parents[1])
    (tmp_path / "prog.py").write_text(FORK_HANG)
    fifo = tmp_path / "release"
    os.mkfifo(fifo)
    out = tmp_path / "out"
    p = subprocess.Popen([sys.executable, str(tmp_path / "prog.py"), repo, str(out), str(fifo)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        child_text = ""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and "child_work(10)" not in child_text:
            files = [f for f in out.glob("trace-*.txt") if "forked_from=" in f.read_text().split("\n", 1)[0]]
            child_text = files[0].read_text() if files else ""
            time.sleep(0.05)
        assert "--> " in child_text and "    prog.py:" in child_text and "child_work(10)" in child_text, child_text
        assert "with open(sys.argv[3]) as f:" in child_text
    finally:
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # the child's read returns: both exit
        except OSError:  # no reader: the child is not (or no longer) waiting
            pass
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)  # the parent and its forked child
            p.wait(timeout=30)
            raise
    assert p.returncode == 0, p.communicate(timeout=30)[1]


FORK_WAKEUP = textwrap.dedent('''
    import os, signal, sys
    sys.path.insert(0, sys.argv[1])
    from ml_debug.nicertrace import NicerTrace

    def wakeup_pipe():
        fd = signal.set_wakeup_fd(-1)
        signal.set_wakeup_fd(fd, warn_on_full_buffer=False)
        return os.fstat(fd).st_ino if fd != -1 else None

    def main():
        parent = wakeup_pipe()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(w, repr(wakeup_pipe()).encode())
            os._exit(0)
        os.waitpid(pid, 0)
        print("PARENT", parent, "CHILD", os.read(r, 100).decode())

    NicerTrace(count=0, packages_to_include="uninstalled", out_dir=sys.argv[2], ring=100).runfunc(main)
''')


def test_forked_child_signals_do_not_wake_the_parents_watchdog(tmp_path):
    """A signal to a forked child (a pool terminating a worker) must wake the child's own watchdog:
    on the parent's pipe, the parent's watchdog took it for its own, dumped and ended the parent."""
    import subprocess

    repo = str(Path(nicertrace.__file__).resolve().parents[1])
    (tmp_path / "prog.py").write_text(FORK_WAKEUP)
    p = subprocess.run([sys.executable, str(tmp_path / "prog.py"), repo, str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    _, parent, _, child = p.stdout.split()
    assert parent != "None" and child != "None"  # both have a watchdog woken by signals
    assert child != parent
