"""printflock: whole lines from many processes, to a pipe and to a file, with the lock where asked."""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

NPROC, NLINES, WIDTH = 16, 2000, 4096
LINE = re.compile(r"^(\[\S+:\d+\] )?p(\d\d) (\d{5}) (x{" + str(WIDTH) + r"})$")

WORKER = f"""
import os, sys
sys.path.insert(0, {str(REPO)!r})
from ml_debug.printflock import printflock as print
me = int(sys.argv[1])
body = "x" * {WIDTH}
for i in range({NLINES}):
    print(f"p{{me:02d}} {{i:05d}}", body)
"""


def _start(n: int, stdout, env: dict[str, str]) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", WORKER, str(i)], stdout=stdout, env=env) for i in range(n)]


def _check(text: str, nproc: int = NPROC, nlines: int = NLINES) -> None:
    lines = text.split("\n")
    assert lines[-1] == ""
    lines = lines[:-1]
    assert len(lines) == nproc * nlines
    seen: dict[int, list[int]] = {}
    for line in lines:
        m = LINE.match(line)
        assert m, f"torn line: {line[:80]!r}... ({len(line)} chars)"
        seen.setdefault(int(m.group(2)), []).append(int(m.group(3)))
    assert sorted(seen) == list(range(nproc))
    for numbers in seen.values():
        assert numbers == list(range(nlines))  # in order per process, none lost


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLDEBUG_PRINTFLOCK")}
    return {**env, **extra}


def test_many_processes_one_pipe_gives_intact_lines():
    r, w = os.pipe()
    procs = _start(NPROC, w, _env())
    os.close(w)
    with os.fdopen(r, "r") as reader:
        text = reader.read()
    assert all(p.wait(timeout=120) == 0 for p in procs)
    _check(text)


def test_many_processes_one_file_gives_intact_lines(tmp_path: Path):
    out = tmp_path / "out.txt"
    with open(out, "w") as f:
        procs = _start(NPROC, f, _env())
        assert all(p.wait(timeout=120) == 0 for p in procs)
    _check(out.read_text())


def test_lock_placed_by_environment_variable(tmp_path: Path):
    lock = tmp_path / "node-local.lock"
    r, w = os.pipe()
    procs = _start(NPROC, w, _env(MLDEBUG_PRINTFLOCK_PATH=str(lock)))
    os.close(w)
    with os.fdopen(r, "r") as reader:
        text = reader.read()
    assert all(p.wait(timeout=120) == 0 for p in procs)
    _check(text)
    assert lock.exists()


def test_print_compatible_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    from ml_debug.printflock import printflock

    printflock("a", 1, None, sep="-", end="!\n")
    printflock()
    printflock("x", "y", sep=None, end=None)
    with open(tmp_path / "f.txt", "w") as f:
        printflock("to file", file=f, flush=True, lock_path=str(tmp_path / "l.lock"))
    assert capsys.readouterr().out == "a-1-None!\n\nx y\n"
    assert (tmp_path / "f.txt").read_text() == "to file\n"
    assert not (REPO / "ml_debug" / "printflock.lock").exists()


def test_prefix_labels_every_line(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch):
    from ml_debug.printflock import printflock

    monkeypatch.setenv("RANK", "7")
    printflock("one\ntwo", prefix=True)
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and all(re.match(r"^\[\S+:7\] (one|two)$", line) for line in out)
    monkeypatch.setenv("MLDEBUG_PRINTFLOCK_PREFIX", "1")
    printflock("three")
    assert capsys.readouterr().out.endswith(":7] three\n")
    # the words MLDEBUG_JSON takes: `false`/`no`/`off` are off (they turned the prefix on)
    for word, on in (("true", True), ("Yes", True), ("on", True), ("false", False), ("no", False),
                     ("OFF", False), ("0", False), ("", False)):
        monkeypatch.setenv("MLDEBUG_PRINTFLOCK_PREFIX", word)
        printflock("four")
        out = capsys.readouterr().out
        assert (out.endswith(":7] four\n") if on else out == "four\n"), (word, out)


def test_module_is_callable_and_imports_nothing_heavy():
    code = ("import sys; from ml_debug import printflock; printflock('hi', 2); "
            "import ml_debug.printflock as m; m.printflock('ok'); "
            "print(sorted(x for x in ('torch', 'rich', 'typer') if x in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "hi 2\nok\n[]\n"


def test_safe_across_fork():
    code = f"""
import os, sys
sys.path.insert(0, {str(REPO)!r})
from ml_debug.printflock import printflock as print
print("parent-before")
kids = []
for k in range(4):
    pid = os.fork()
    if pid == 0:
        for i in range(500):
            print(f"kid{{k}} {{i:04d}}", "y" * 5000)
        os._exit(0)
    kids.append(pid)
for i in range(500):
    print(f"parent {{i:04d}}", "y" * 5000)
for pid in kids:
    os.waitpid(pid, 0)
"""
    out = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, timeout=120)
    lines = out.stdout.splitlines()
    assert lines[0] == "parent-before"
    body = lines[1:]
    assert len(body) == 2500
    assert all(re.match(r"^(kid\d|parent) \d{4} y{5000}$", line) for line in body)


def test_control_plain_print_tears_lines_so_the_check_can_fail():
    plain = WORKER.replace("from ml_debug.printflock import printflock as print", "")
    r, w = os.pipe()
    procs = [subprocess.Popen([sys.executable, "-c", plain, str(i)], stdout=w) for i in range(NPROC)]
    os.close(w)
    with os.fdopen(r, "r") as reader:
        text = reader.read()
    assert all(p.wait(timeout=120) == 0 for p in procs)
    with pytest.raises(AssertionError, match="torn line"):
        _check(text)


# --- the same results as builtin print -------------------------------------------------------


class _WriteOnly:
    """A file with write() and nothing else: all that builtin print needs."""

    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return len(text)


class _Flushable(_WriteOnly):
    def __init__(self) -> None:
        super().__init__()
        self.flushes = 0

    def flush(self) -> None:
        self.flushes += 1


class _Unprintable:
    def __str__(self) -> str:
        raise ValueError("no text for this one")


def _outcome(fn, args: tuple, kwargs: dict, file_kind: str, monkeypatch: pytest.MonkeyPatch):
    """(text written, exception type, message, writes, flushes) of one call."""
    target: _WriteOnly | None = None
    if file_kind == "write-only":
        target = _WriteOnly()
        kwargs = {**kwargs, "file": target}
    elif file_kind == "flushable":
        target = _Flushable()
        kwargs = {**kwargs, "file": target}
    elif file_kind == "stdout":
        target = _Flushable()
        monkeypatch.setattr(sys, "stdout", target)
    elif file_kind == "stdout-is-None":
        monkeypatch.setattr(sys, "stdout", None)
    elif file_kind == "int":
        kwargs = {**kwargs, "file": 5}
    elif file_kind == "object":
        kwargs = {**kwargs, "file": object()}
    else:
        raise AssertionError(file_kind)
    error: tuple[type, str] | None = None
    try:
        fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - the exception is the thing compared
        error = (type(e), str(e))
    finally:
        monkeypatch.undo()
    writes = target.writes if target is not None else []
    return "".join(writes), error, len(writes), getattr(target, "flushes", None)


CASES = [
    (("a", 1, None), {"sep": "-", "end": "!\n"}),
    ((), {}),
    (("x", "y"), {"sep": None, "end": None}),
    (("x", "y"), {"sep": "", "end": ""}),
    (("multi\nline", 2.5), {}),
    (("x",), {"flush": True}),
    (("x",), {"flush": "yes"}),  # any true value asks for a flush, as in print
    (("x",), {"flush": 0}),
    (("x",), {"sep": 1}),
    (("x",), {"end": b"\n"}),
    (("x",), {"sep": collections.OrderedDict()}),  # print names the type as "collections.OrderedDict"
    (("x",), {"foo": 1}),
    (("x",), {"sep": 1, "foo": 1}),  # the unknown keyword is reported first
    (("x",), {"foo": 1, "bar": 2}),
]
FILES = ["write-only", "flushable", "stdout", "stdout-is-None", "int", "object"]


@pytest.mark.parametrize("file_kind", FILES)
@pytest.mark.parametrize("args, kwargs", CASES)
def test_same_result_as_builtin_print(args: tuple, kwargs: dict, file_kind: str, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from ml_debug.printflock import printflock

    monkeypatch.setenv("MLDEBUG_PRINTFLOCK_PATH", str(tmp_path / "lock"))
    monkeypatch.delenv("MLDEBUG_PRINTFLOCK_PREFIX", raising=False)
    text, error, _, _ = _outcome(print, args, kwargs, file_kind, monkeypatch)
    ours, our_error, writes, flushes = _outcome(printflock, args, kwargs, file_kind, monkeypatch)
    assert (ours, our_error) == (text, error)
    if error is None and file_kind != "stdout-is-None":
        assert writes == 1  # the whole text in one write: no other process can come between
        if file_kind in ("flushable", "stdout"):
            assert flushes == 1  # flushed inside the lock even without flush=True


@pytest.mark.parametrize("file_kind", ["write-only", "flushable", "stdout"])
def test_text_that_cannot_be_formatted_writes_nothing(file_kind: str, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from ml_debug.printflock import printflock

    monkeypatch.setenv("MLDEBUG_PRINTFLOCK_PATH", str(tmp_path / "lock"))
    args = ("before", _Unprintable(), "after")
    _, error, _, _ = _outcome(print, args, {}, file_kind, monkeypatch)
    ours, our_error, _, _ = _outcome(printflock, args, {}, file_kind, monkeypatch)
    assert our_error == error == (ValueError, "no text for this one")
    assert ours == ""  # print has already written "before " by then; printflock writes all or nothing


def test_lost_sys_stdout_as_print(monkeypatch: pytest.MonkeyPatch) -> None:
    from ml_debug.printflock import printflock

    monkeypatch.delattr(sys, "stdout")
    for fn in (print, printflock):
        with pytest.raises(RuntimeError, match="lost sys.stdout"):
            fn("x")


@pytest.mark.parametrize("value", ["abc", "", "nan", "-5", "inf"])
def test_a_bad_timeout_setting_never_fails_a_print(value: str, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """MLDEBUG_PRINTFLOCK_TIMEOUT=abc raised ValueError at every print: the job died at its first one."""
    from ml_debug.printflock import printflock

    monkeypatch.setenv("MLDEBUG_PRINTFLOCK_TIMEOUT", value)
    monkeypatch.setenv("MLDEBUG_PRINTFLOCK_PATH", str(tmp_path / "lock"))
    printflock("hello", 1)
    assert capsys.readouterr().out == "hello 1\n"
