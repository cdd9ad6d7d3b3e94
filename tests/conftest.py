"""Shared test helpers.

Real parts (torchrun, py-spy, gdb, sshd, Slurm) are required: when one is missing a test
FAILS if MLDEBUG_REQUIRE_REAL=1 (as in CI, set by tests/run.sh) and skips otherwise.
Golden files are compared, never written, unless MLDEBUG_UPDATE_GOLDEN=1 (outside CI).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import pytest

from ml_debug.procs.tree import pids_with_env as pids_with_env  # the tests' own processes, by a marker

pytest_plugins = ["tests.rig.fixtures"]

REPO = Path(__file__).resolve().parents[1]
REQUIRE_REAL = os.environ.get("MLDEBUG_REQUIRE_REAL") == "1"
# CI sets CI=true; either flag means a missing part or golden file is a failure, not a skip.
IN_CI = REQUIRE_REAL or os.environ.get("CI", "").lower() == "true"
T = TypeVar("T")


def require(condition: object, what: str) -> None:
    """Fail (CI) or skip (a laptop) when a real part is missing."""
    if not condition:
        if REQUIRE_REAL:
            pytest.fail(f"required real part missing: {what}")
        pytest.skip(f"real part missing: {what}")


def require_module(name: str, why: str = "") -> ModuleType:
    """Import `name`; when it is missing, fail (CI) or skip (a laptop), as `require` does.

    The replacement for `pytest.importorskip`, which would skip silently in CI too."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        what = f"Python module {name} ({e}){': ' + why if why else ''}"
        if REQUIRE_REAL:
            pytest.fail(f"required real part missing: {what}")
        pytest.skip(f"real part missing: {what}", allow_module_level=True)
        raise  # not reached


def read_golden(path: Path, fresh: str) -> str:
    """The text of the golden file `path`, which `fresh` (this run's output) is to be compared with.

    A golden file is only ever written on request (MLDEBUG_UPDATE_GOLDEN=1, never in CI): it is
    written from `fresh` and the test skips, because comparing a file with what was just written
    into it proves nothing. A missing golden file fails in CI (MLDEBUG_REQUIRE_REAL=1 or CI=true)
    and skips elsewhere; it is never created silently."""
    rel = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    if os.environ.get("MLDEBUG_UPDATE_GOLDEN") == "1":
        if IN_CI:
            pytest.fail(f"MLDEBUG_UPDATE_GOLDEN=1 under CI would compare {rel} with itself: unset it")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(fresh)
        pytest.skip(f"wrote golden file {rel}: review the diff, commit it, rerun without MLDEBUG_UPDATE_GOLDEN")
    if not path.exists():
        msg = f"golden file {rel} is missing: create it with MLDEBUG_UPDATE_GOLDEN=1 and commit it"
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)
    return path.read_text()


def check_golden(path: Path, text: str) -> None:
    """Assert that `text` equals the golden file `path` (see `read_golden`)."""
    assert text == read_golden(path, text), f"output differs from golden file {path.name} " \
        "(MLDEBUG_UPDATE_GOLDEN=1 rewrites it)"


def wait_until(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.05,
               why: Callable[[], str] | None = None) -> T:
    """Poll `predicate` until it returns something truthy (returned) or `timeout` s pass (the test
    fails, naming `what`, and what `why` says of the last try). The one way tests wait for an observable
    condition."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}" + (f": {why()}" if why else ""))
        time.sleep(interval)


def stderr_until(proc: subprocess.Popen[str], marker: str, what: str) -> str:
    """Read `proc`'s stderr line by line until a line holds `marker` (what was read); the test fails
    if the stream ends first (`what` names the wait). pytest-timeout bounds a process that stays silent."""
    assert proc.stderr is not None
    err = ""
    while marker not in err:
        line = proc.stderr.readline()
        assert line, f"{what}: the process ended first: {err[-3000:]}"
        err += line
    return err


@contextlib.contextmanager
def closed_port(host: str = "127.0.0.1") -> Iterator[int]:
    """A TCP port the OS picked, held bound (so nobody else can take it) but never listening:
    connecting to it is refused at once. For "a host/rank that is not there"."""
    with socket.socket() as s:
        s.bind((host, 0))
        yield int(s.getsockname()[1])


@contextlib.contextmanager
def exclusive(name: str, timeout: float = 240) -> Iterator[None]:
    """Hold the machine-wide lock `name` for a block. Tests that judge every process of a kind on this
    machine ("no debugger process is left anywhere") take one: the same kind of test on another xdist
    worker then waits instead of showing up in their count. Only tests sharing `name` wait for each other."""
    import fcntl
    import tempfile

    with open(Path(tempfile.gettempdir()) / f"mldebug-tests-{name}.lock", "a") as f:
        wait_until(lambda: _try_flock(f.fileno(), fcntl), timeout, f"the test lock {name!r}", interval=0.2)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _try_flock(fd: int, fcntl: ModuleType) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


@pytest.fixture
def debuggers_alone() -> Iterator[None]:
    """The test counts every debugpy process on the machine: no other such test runs meanwhile."""
    with exclusive("debuggers"):
        yield


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A port on 127.0.0.1 where connections are refused for the whole test (see closed_port)."""
    with closed_port() as port:
        yield port


@contextlib.contextmanager
def reserved_port(host: str = "127.0.0.1") -> Iterator[int]:
    """A TCP port the OS picked, reserved for a server the test starts (rank 0's TCPStore, torchrun's
    rendezvous): held bound with SO_REUSEADDR but not listening, so no other socket can take it while
    the server (which binds with SO_REUSEADDR too, as torch's TCPStore does) starts listening on it.
    No free-port-then-bind race."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, 0))
        yield int(s.getsockname()[1])


def py_spy() -> str | None:
    """The py-spy binary of this venv (or PATH)."""
    here = Path(sys.executable).parent / "py-spy"
    return str(here) if here.exists() else shutil.which("py-spy")


def main_thread_frames(pid: int) -> list[tuple[str, str]] | None:
    """(function, file) of `pid`'s main-thread Python stack, innermost first (`py-spy dump --json`);
    None when it cannot be read right now (not started yet, exiting, or no py-spy)."""
    exe = py_spy()
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "dump", "--pid", str(pid), "--json"], capture_output=True, text=True, timeout=30)
        threads = json.loads(out.stdout) if out.returncode == 0 else []
    except (subprocess.TimeoutExpired, ValueError):
        return None
    if not threads:
        return None
    main = next((t for t in threads if t.get("os_thread_id") == pid), None) or \
        next((t for t in threads if t.get("thread_name") == "MainThread"), threads[0])
    return [(f["name"], f.get("filename") or "") for f in main.get("frames", [])]


def main_thread_functions(pid: int) -> list[str] | None:
    """Function names of `pid`'s main-thread Python stack, innermost first (see main_thread_frames)."""
    frames = main_thread_frames(pid)
    return None if frames is None else [name for name, _ in frames]


def wait_in_function(pid: int, names: set[str] | frozenset[str], timeout: float = 60, innermost: bool = True) -> None:
    """Wait until `pid`'s main thread is in one of the Python functions `names` (the innermost
    frame, or any frame with innermost=False), seen by py-spy: "the process reached its hang point"."""
    require(py_spy(), "py-spy (to see where a process is)")

    def there() -> bool:
        stack = main_thread_functions(pid)
        if not stack:
            return False
        return stack[0] in names if innermost else bool(names & set(stack))

    wait_until(there, timeout, f"pid {pid} to be in {sorted(names)}", interval=0.1)


def kill_pids(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def mldebug(*args: str, timeout: float = 300, env: dict[str, str] | None = None,
            cwd: str | Path | None = None, input: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real `mldebug` CLI in a subprocess (python -m ml_debug) and capture its output.

    The repository root goes first on PYTHONPATH, so the CLI and every rank it starts can load the
    test hooks (tests.fakes) that `env` may name through MLDEBUG_TEST_HOOKS, from any `cwd`."""
    from tests.fakes import pythonpath

    full_env = {**os.environ, "MLDEBUG_WIDTH": "160", "OMP_NUM_THREADS": "1", **(env or {})}
    full_env["PYTHONPATH"] = pythonpath(full_env)
    return subprocess.run([sys.executable, "-m", "ml_debug", *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=cwd, input=input)


@pytest.fixture
def run_mldebug():
    return mldebug


def import_from_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, text: str) -> ModuleType:
    """``text`` imported as module ``name`` from a folder outside site-packages and the standard library
    (user code, as NicerTrace sees it); the caller drops it from sys.modules when done."""
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(src))
    sys.modules.pop(name, None)
    return importlib.import_module(name)


def validate_schema(doc: dict, name: str) -> None:
    """Validate a command's JSON document against its pinned schema in ml_debug/schemas/."""
    schema_validator(name).validate(doc)


@functools.cache
def schema_validator(name: str) -> Any:
    """The validator of a pinned schema, the schema itself checked once (``jsonschema.validate`` checks it against
    its metaschema on every call: most of the fuzz test's time)."""
    import jsonschema

    schema = json.loads((REPO / "ml_debug" / "schemas" / f"{name}.json").read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


# ----------------------------------------------------------------------------- order (pytest-xdist)

# tests/run.sh hands tests to the xdist workers two at a time, in collection order (`--dist load
# --maxschedchunk 2`). The modules with the longest tests (half a minute and more) go first: the
# workers share them out and then end together on short tests, instead of one waiting out the other's
# last long one (the alphabetical order put cli/test_watch.py last). Paths below tests/.
LONGEST_FIRST = ("cli/test_drill.py", "package/test_install_docs.py", "cli/test_watch.py", "cli/test_attach_remote.py", "cli/test_attach.py", "cli/test_exporter.py",
                 "cli/test_train.py", "rig/test_slurm_hook.py", "cli/test_self_launch.py", "cli/test_lifecycle.py")

# The folder a test lives in is its kind (tests/README.md): `unit`, `cli`, `rig`, `gpu`, `package`.
# A test elsewhere that uses the rig (one of these fixtures) is marked `rig` too, so `-m "not rig"`
# runs what needs no sshd or Slurm.
FOLDER_MARKERS = ("unit", "cli", "rig", "gpu", "package")
RIG_FIXTURES = frozenset({"rig_ssh", "rig_nodes", "rig_slurm", "hung_job"})
TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    first = {name: i for i, name in enumerate(LONGEST_FIRST)}
    for item in items:
        kind = item.path.relative_to(TESTS).parts[0] if item.path.is_relative_to(TESTS) else ""
        if kind in FOLDER_MARKERS:
            item.add_marker(kind)
        if kind != "rig" and RIG_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker("rig")

    def rank(item: pytest.Item) -> int:
        rel = item.path.relative_to(TESTS).as_posix() if item.path.is_relative_to(TESTS) else ""
        return first.get(rel, len(first))

    items.sort(key=rank)  # stable: each module keeps its order


# ----------------------------------------------------------------------------- Ctrl-C reaches the children

def pytest_configure(config: pytest.Config) -> None:
    """A suite started in the background (`cmd &` in a script, nohup) inherits SIGINT ignored, and so would
    every process the tests start: the Ctrl-C tests would see mldebug shrug SIGINT off. Python's own handler
    here becomes the default disposition in children (exec resets handlers; only "ignored" is inherited)."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# ----------------------------------------------------------------------------- the collector and a big heap

@pytest.fixture(scope="session", autouse=True)
def _heap_of_collection_frozen() -> Iterator[None]:
    """What collection loaded (torch, every test module and item) lives as long as the run: frozen, the
    cyclic collector stops walking it in every full collection that a test's allocations trigger."""
    import gc

    gc.collect()
    gc.freeze()  # 7 in-process modules (train_unit, hostlist, stacks_merge, ...): 19.2 -> 14.8 CPU s
    yield
