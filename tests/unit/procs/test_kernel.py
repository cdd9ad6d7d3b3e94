"""procs/kernel.py on real blocked processes: what the kernel says below the Python stack (the seed
handbook's strace section): the call, the file or peer behind its descriptor, the state, spinning."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ml_debug.procs.kernel import KernelView, look, verdict
from tests.conftest import REPO, mldebug, wait_until


@pytest.fixture
def spawn() -> Iterator:
    procs: list[subprocess.Popen[bytes]] = []

    def start(code: str) -> subprocess.Popen[bytes]:
        p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL)
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.kill()
        p.wait(timeout=10)


def _settled(pid: int, call: str) -> KernelView:
    """The view once the process stands in ``call`` (it may still be starting Python)."""
    return wait_until(lambda: (v := look(pid, interval_s=0.05, looks=2)).syscall == call and v, 30,
                      f"pid {pid} to block in {call}()")


def test_a_rank_blocked_reading_a_fifo_names_the_fifo(tmp_path: Path, spawn) -> None:
    fifo = tmp_path / "labels-part-17"
    os.mkfifo(fifo)
    reader = spawn(f"import os; fd = os.open({str(fifo)!r}, os.O_RDONLY | os.O_NONBLOCK); "
                   "os.set_blocking(fd, True); os.read(fd, 10)")
    writer = os.open(fifo, os.O_RDWR)  # a writer that never writes: the reader waits in read()
    try:
        v = _settled(reader.pid, "read")
        assert v.descriptor is not None and v.descriptor.kind == "fifo" and v.descriptor.target == str(fifo)
        assert v.verdict.startswith(f"blocked in read() on {fifo} (fd {v.descriptor.fd})"), v.verdict
        assert v.state == "S" and v.wchan, v
    finally:
        os.close(writer)


def test_dump_stacks_says_a_rank_is_blocked_reading_a_fifo(tmp_path: Path, spawn) -> None:
    """The issue's hidden job: a rank (RANK in its environment) stuck reading a FIFO nobody writes to.
    dump-stacks' JSON, summary and table name the call and the FIFO's path."""
    fifo = tmp_path / "labels"
    os.mkfifo(fifo)
    rank = subprocess.Popen([sys.executable, "-c", f"import os, time\nfd = os.open({str(fifo)!r}, os.O_RDONLY)\n"
                             "def load_labels():\n    return os.read(fd, 10)\nload_labels()"],
                            env={**os.environ, "RANK": "3", "WORLD_SIZE": "4"})
    writer = os.open(fifo, os.O_WRONLY)
    try:
        _settled(rank.pid, "read")
        proc = mldebug("dump-stacks", "--pid", str(rank.pid), "--json", timeout=120)
        doc = json.loads(proc.stdout)["result"]
        (p,) = doc["processes"]
        assert p["kernel"]["verdict"].startswith(f"blocked in read() on {fifo} (fd "), p["kernel"]
        assert "below Python: rank 3 (" in doc["summary"] and f"blocked in read() on {fifo}" in doc["summary"]
        human = mldebug("dump-stacks", "--pid", str(rank.pid), timeout=120).stdout
        assert "below Python (what the kernel says" in human and f"blocked in read() on {fifo}" in human, human
        off = json.loads(mldebug("dump-stacks", "--pid", str(rank.pid), "--json", "--no-kernel", timeout=120).stdout)
        assert off["result"]["processes"][0]["kernel"] is None and "below Python" not in off["result"]["summary"]
    finally:
        os.close(writer)
        rank.kill()
        rank.wait(timeout=10)


def test_an_open_waiting_for_a_fifos_writer_names_the_path(tmp_path: Path, spawn) -> None:
    fifo = tmp_path / "no-writer"
    os.mkfifo(fifo)
    p = spawn(f"open({str(fifo)!r}).read()")
    v = _settled(p.pid, "openat")
    assert v.path == str(fifo) and v.verdict.startswith(f"blocked in openat() on {fifo}"), v.verdict


def test_a_file_lock_and_a_socket_recv_name_the_file_and_the_peer(tmp_path: Path, spawn) -> None:
    lock = tmp_path / "ckpt.lock"
    lock.write_text("")
    holder = spawn(f"import fcntl, time; f = open({str(lock)!r}); fcntl.flock(f, fcntl.LOCK_EX); time.sleep(600)")
    wait_until(lambda: look(holder.pid, 0.05, 2).syscall in ("clock_nanosleep", "nanosleep"), 30, "the lock holder")
    waiter = spawn(f"import fcntl; f = open({str(lock)!r}); fcntl.flock(f, fcntl.LOCK_EX)")
    v = _settled(waiter.pid, "flock")
    assert v.verdict.startswith(f"blocked in flock() on {lock} (fd "), v.verdict

    server = socket.create_server(("127.0.0.1", 0))
    try:
        port = server.getsockname()[1]
        client = spawn(f"import socket; c = socket.create_connection(('127.0.0.1', {port})); c.recv(1)")
        conn, _ = server.accept()
        v = _settled(client.pid, "recvfrom")
        assert v.descriptor is not None and v.descriptor.kind == "socket", v
        assert f"-> 127.0.0.1:{port} established" in (v.descriptor.peer or ""), v.descriptor
        assert "blocked in recvfrom() on a socket (tcp 127.0.0.1:" in v.verdict, v.verdict
        conn.close()
    finally:
        server.close()


def test_a_busy_loop_is_spinning_and_a_sleeper_is_not(spawn) -> None:
    spinner = spawn("while True: pass")
    sleeper = spawn("import time; time.sleep(600)")
    v = wait_until(lambda: (x := look(spinner.pid, interval_s=0.5)).spinning and x, 30, "the loop to be seen spinning")
    assert v.verdict.startswith("spinning: ") and "no system call" in v.verdict, v.verdict
    s = _settled(sleeper.pid, "clock_nanosleep")
    assert not s.spinning and s.verdict.startswith("blocked in clock_nanosleep()"), s.verdict


def test_strace_tells_a_spin_from_a_loop_that_sleeps(spawn) -> None:
    """--strace S: `strace -c -p PID` of every rank at once, for S seconds (strace from Debian's package)."""
    from tests.conftest import require

    require(__import__("shutil").which("strace"), "strace (apt-get install strace)")
    from ml_debug.procs.kernel import look_many

    spinner = spawn("while True: pass")
    napper = spawn("import time\nwhile True: time.sleep(0.01)")
    wait_until(lambda: look(napper.pid, 0.05, 1).syscall == "clock_nanosleep", 30, "the napper to start")
    views = look_many([spinner.pid, napper.pid], interval_s=0.3, strace_s=1.0)
    spin, nap = views[spinner.pid], views[napper.pid]
    assert spin.strace is not None and spin.strace.calls == {} and spin.strace.error is None, spin.strace
    if spin.spinning:
        assert spin.verdict.endswith("no system call in 1 s"), spin.verdict
    else:  # a loaded node may not have run it at every look; strace's count is the fact
        assert spin.verdict.endswith("no system call completed in 1 s (strace)"), spin.verdict
    assert nap.strace is not None and nap.strace.calls.get("clock_nanosleep", 0) >= 10, nap.strace
    assert "system call(s) in 1 s (strace): clock_nanosleep " in nap.verdict, nap.verdict


def test_stopped_ended_and_unknown_states(spawn) -> None:
    p = spawn("import time; time.sleep(600)")
    _settled(p.pid, "clock_nanosleep")
    os.kill(p.pid, signal.SIGSTOP)
    wait_until(lambda: look(p.pid, 0.05, 1).state == "T", 10, "the process to stop")
    assert look(p.pid, 0.05, 1).verdict.startswith("stopped")
    p.kill()
    p.wait(timeout=10)
    gone = look(p.pid, 0.05, 1)
    assert gone.error == "the process ended" and gone.verdict == "ended"
    assert verdict(KernelView(1, state="Z")).startswith("a zombie")
    assert "uninterruptible sleep in read()" in verdict(KernelView(1, state="D", syscall="read", wchan="nfs_wait"))


def test_without_ptrace_rights_the_call_is_unknown_and_said_so(spawn) -> None:
    """An unprivileged user may not read root's /proc/PID/syscall: the view says why, the state still shows."""
    if os.geteuid() != 0:
        pytest.skip("needs root to drop to another user")
    p = spawn("import time; time.sleep(600)")
    _settled(p.pid, "clock_nanosleep")
    code = ("import sys; from ml_debug.procs.kernel import look; v = look(int(sys.argv[1]), 0.05, 1); "
            "print(v.state, '|', v.syscall, '|', v.error)")
    out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", code,
                          str(p.pid)], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    state, call, error = (w.strip() for w in out.stdout.split("|"))
    assert state == "S" and call == "None" and "no permission" in error, out.stdout


def test_a_spinning_process_holding_an_nvidia_device_reads_as_a_cuda_wait() -> None:
    # the CUDA runtime spins (or yields) in frames py-spy often cannot unwind: the device file is the clue
    v = KernelView(1, state="R", syscall="running", looks=5, in_user_space_throughout=True, cpu_share=0.99,
                   gpu_device="/dev/nvidia0")
    said = verdict(v)
    assert said.startswith("spinning: 99% CPU") and "with /dev/nvidia0 open: a CUDA call waiting on the GPU" in said
    assert "GPU" not in verdict(KernelView(1, state="R", syscall="running", looks=5, in_user_space_throughout=True,
                                           cpu_share=0.99))
