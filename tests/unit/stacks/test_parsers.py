"""Parsing the dumpers' output. The texts are excerpts of real output captured on this machine
(py-spy 0.4.3, pystack 1.7.2, gdb 13) from a hung 4-rank gloo job."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from ml_debug.stacks.dumpers import DumpOptions, dump_process, gdb_python_helper, resolve_tools
from ml_debug.stacks.parsers import PYBT_MARK, parse_gdb, parse_gdb_frame, parse_pyspy_json, parse_pystack
from tests.conftest import require, wait_in_function

PYSPY = json.dumps([{
    "pid": 7005, "thread_id": 140445886241664, "thread_name": "MainThread", "os_thread_id": 7005, "active": False,
    "owns_gil": False, "frames": [
        {"name": "load_batch", "filename": "/tmp/ds_dev/worker.py", "module": None, "short_filename": "worker.py",
         "line": 5, "locals": None},
        {"name": "main", "filename": "/tmp/ds_dev/worker.py", "module": None, "short_filename": "worker.py",
         "line": 28, "locals": [{"name": "t", "addr": 1, "arg": False, "repr": "tensor([4.])"}]}]},
    {"pid": 7005, "thread_id": 1, "thread_name": "Thread-1", "os_thread_id": 7010, "active": False, "owns_gil": False,
     "frames": []}])

PYSTACK = """Traceback for thread 7005 (python3) [Has the GIL] (most recent call last):
    (C) File "???", line 0, in _start (/root/.pyenv/versions/3.11.7/bin/python3.11)
    (Python) File "/tmp/ds_dev/worker.py", line 31, in <module>
        main()
    (Python) File "/tmp/ds_dev/worker.py", line 28, in main
        load_batch()
    (Python) File "/tmp/ds_dev/worker.py", line 5, in load_batch
        time.sleep(3600)
    (C) File "./Modules/timemodule.c", line 383, in time_sleep (/root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0)

Traceback for thread 7108 (python3) [] (most recent call last):
    (C) File "???", line 0, in clone3 (/usr/lib/x86_64-linux-gnu/libc.so.6)
"""

GDB = f"""[Thread debugging using libthread_db enabled]
Thread 2 (Thread 0x7fbbfba296c0 (LWP 7108) "gloo_tcp_loop"):
#0  0x00007fbc1ab26f36 in epoll_wait (epfd=..., events=..., maxevents=..., timeout=...) at ../sysdeps/unix/sysv/linux/epoll_wait.c:30
#1  0x00007fbc0c77d62d in gloo::transport::tcp::Loop::run() () from /venv/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so
#2  0x00007fbc038d44a3 in ?? () from /lib/x86_64-linux-gnu/libstdc++.so.6

Thread 1 (Thread 0x7fbc1b28db80 (LWP 7005) "python3"):
#0  0x00007fbc1aaed545 in __GI___clock_nanosleep (clock_id=..., flags=..., req=..., rem=...) at ../sysdeps/unix/sysv/linux/clock_nanosleep.c:48
#1  0x00007fbc1af15ada in pysleep (timeout=...) at ./Modules/timemodule.c:2159
#2  time_sleep (self=..., timeout_obj=...) at ./Modules/timemodule.c:383
{PYBT_MARK}

Thread 2 (Thread 0x7fbbfba296c0 (LWP 7108) "gloo_tcp_loop"):
Unable to locate python frame

Thread 1 (Thread 0x7fbc1b28db80 (LWP 7005) "python3"):
Traceback (most recent call first):
  <built-in method sleep of module object at remote 0x7fbc1a9c7420>
  File "/tmp/ds_dev/worker.py", line 5, in load_batch
    time.sleep(3600)
  File "/tmp/ds_dev/worker.py", line 28, in main
    load_batch()
[Inferior 1 (process 7005) detached]
"""


def test_pyspy_json() -> None:
    threads = parse_pyspy_json(PYSPY, 7005)
    main = [t for t in threads if t.is_main]
    assert len(main) == 1 and main[0].name == "MainThread"
    assert [f.where() for f in main[0].frames] == ["load_batch (worker.py:5)", "main (worker.py:28)"]
    assert main[0].frames[1].locals == {"t": "tensor([4.])"}


def test_pystack_text_is_turned_innermost_first() -> None:
    threads = parse_pystack(PYSTACK, 7005)
    assert [t.os_thread_id for t in threads] == [7005, 7108]
    main = threads[0]
    assert main.is_main and main.owns_gil
    assert [f.name for f in main.frames] == ["load_batch", "main", "<module>"]
    assert [f.name for f in main.native_frames] == ["time_sleep", "_start"]


def test_gdb_bt_and_py_bt() -> None:
    threads = parse_gdb(GDB, 7005)
    assert [t.os_thread_id for t in threads] == [7108, 7005]
    gloo, main = threads
    assert gloo.name == "gloo_tcp_loop" and not gloo.is_main and gloo.frames == []
    assert [f.name for f in gloo.native_frames] == ["epoll_wait", "gloo::transport::tcp::Loop::run()", "??"]
    assert main.is_main
    assert [f.name for f in main.native_frames] == ["__GI___clock_nanosleep", "pysleep", "time_sleep"]
    assert [(f.name, f.line) for f in main.frames] == [("load_batch", 5), ("main", 28)]


def test_gdb_frame_names_lose_addresses_and_arguments() -> None:
    f = parse_gdb_frame("#5  0x00007fbc038a741d in std::condition_variable::wait(std::unique_lock<std::mutex>&) () "
                        "from /lib/x86_64-linux-gnu/libstdc++.so.6")
    assert f is not None
    assert f.name == "std::condition_variable::wait(std::unique_lock<std::mutex>&)"
    assert f.library == "/lib/x86_64-linux-gnu/libstdc++.so.6"


def _sleeper() -> subprocess.Popen[bytes]:
    code = "import time\ndef waiting_here():\n    time.sleep(120)\nprint('ready', flush=True)\nwaiting_here()\n"
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert p.stdout is not None and p.stdout.readline().strip() == b"ready"
    wait_in_function(p.pid, {"waiting_here"})
    return p


def test_every_dumper_reads_a_real_process() -> None:
    require(shutil.which("gdb"), "gdb")
    tools = resolve_tools("auto")
    require(tools.py_spy and tools.pystack, "py-spy and pystack")
    p = _sleeper()
    try:
        for name in ("py-spy", "pystack", "gdb"):
            d = dump_process(p.pid, tools, DumpOptions(dumper=name, gdb_timeout=120))
            assert d.ok, (name, d.error)
            main = d.main_thread()
            assert main is not None
            assert [f.name for f in main.python_frames()][:2] == ["waiting_here", "<module>"], name
            if name == "gdb":
                assert gdb_python_helper(p.pid) is not None and main.native_frames
        native = dump_process(p.pid, tools, DumpOptions(native=True))  # py-spy --native: C frames too
        assert native.ok and native.dumper == "py-spy"
        frames = native.main_thread().frames  # type: ignore[union-attr]
        assert any(f.kind == "native" for f in frames) and frames[0].kind == "native"
        assert [f.name for f in frames if f.kind == "py"][:2] == ["waiting_here", "<module>"]
        assert p.poll() is None  # still running after four attaches
    finally:
        p.kill()
        p.wait()
