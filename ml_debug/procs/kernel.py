"""What the kernel says about a process when its Python stack is not enough: the system call it is
in and its arguments (``/proc/PID/syscall``), the wait channel, the scheduler state, what a file
descriptor argument is (a file, a socket and its peer, a pipe), and whether it is spinning.

The shell equivalent is ``cat /proc/PID/{syscall,wchan,stat}; ls -l /proc/PID/fd; strace -p PID``.
Everything read here is the kernel's own text about the process, never a file the job controls; the
paths it names (a descriptor's target) come from the job, so they are shown escaped by the renderers.
Reading ``syscall`` needs the same permission as ptrace: without it the view says so.
"""

from __future__ import annotations

import errno
import os
import platform
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

# System call numbers of the calls a hung rank is usually found in. x86_64: arch/x86/entry/syscalls/
# syscall_64.tbl; aarch64 (and riscv64): include/uapi/asm-generic/unistd.h, Linux 6.x.
SYSCALLS: dict[str, dict[int, str]] = {
    "x86_64": {
        0: "read", 1: "write", 2: "open", 3: "close", 7: "poll", 16: "ioctl", 17: "pread64", 18: "pwrite64",
        19: "readv", 20: "writev", 23: "select", 24: "sched_yield", 34: "pause", 35: "nanosleep", 42: "connect",
        43: "accept", 44: "sendto", 45: "recvfrom", 46: "sendmsg", 47: "recvmsg", 61: "wait4", 72: "fcntl",
        73: "flock", 74: "fsync", 202: "futex", 228: "clock_gettime", 230: "clock_nanosleep", 232: "epoll_wait",
        247: "waitid", 257: "openat", 270: "pselect6", 271: "ppoll", 281: "epoll_pwait", 288: "accept4",
        299: "recvmmsg", 307: "sendmmsg", 441: "epoll_pwait2",
    },
    "aarch64": {
        22: "epoll_pwait", 25: "fcntl", 29: "ioctl", 32: "flock", 56: "openat", 57: "close", 63: "read",
        64: "write", 65: "readv", 66: "writev", 67: "pread64", 68: "pwrite64", 72: "pselect6", 73: "ppoll",
        82: "fsync", 95: "waitid", 98: "futex", 101: "nanosleep", 113: "clock_gettime", 115: "clock_nanosleep",
        124: "sched_yield", 202: "accept", 203: "connect", 206: "sendto", 207: "recvfrom", 211: "sendmsg",
        212: "recvmsg", 242: "accept4", 243: "recvmmsg", 260: "wait4", 269: "sendmmsg", 441: "epoll_pwait2",
    },
}
# Calls whose first argument is a file descriptor worth naming.
FD_FIRST = frozenset({
    "read", "write", "pread64", "pwrite64", "readv", "writev", "ioctl", "connect", "accept", "accept4", "sendto",
    "recvfrom", "sendmsg", "recvmsg", "recvmmsg", "sendmmsg", "fcntl", "flock", "fsync", "epoll_wait",
    "epoll_pwait", "epoll_pwait2",
})
STATES = {"R": "running", "S": "sleeping", "D": "uninterruptible sleep (disk, NFS or a driver)", "T": "stopped",
          "t": "stopped by a tracer", "Z": "zombie", "X": "dead", "I": "idle", "P": "parked", "W": "waking"}
TCP_STATES = {"01": "established", "02": "syn-sent", "03": "syn-received", "04": "fin-wait-1", "05": "fin-wait-2",
              "06": "time-wait", "07": "close", "08": "close-wait", "09": "last-ack", "0A": "listen",
              "0B": "closing"}
SPIN_CPU = 0.1  # in user space at every look and at least this share of a core (a loaded node gives less)
# Calls whose argument N is a path (open of a FIFO with no writer blocks in it).
PATH_ARG = {"open": 0, "openat": 1}


@dataclass
class Descriptor:
    """One open file descriptor, as ``ls -l /proc/PID/fd/N`` shows it."""

    fd: int
    kind: str
    """file, fifo, pipe, socket, device, anon (eventfd, epoll, ...) or unknown."""
    target: str
    """What the link says (a path, ``socket:[123]``, ``pipe:[45]``)."""
    peer: str | None = None
    """A socket's addresses (``10.0.0.2:43210 -> 10.0.0.3:29500 established``, a unix path)."""

    def describe(self) -> str:
        if self.kind == "socket":
            return f"a socket ({self.peer})" if self.peer else "a socket"
        if self.kind == "pipe":
            return f"a pipe ({self.target})"
        return self.target


@dataclass
class StraceSample:
    """The main thread's system calls over a few seconds: ``strace -c -p PID`` (its other threads, such
    as NCCL's watchdog, are left out: they poll whatever the main thread does)."""

    seconds: float
    calls: dict[str, int] = field(default_factory=dict)
    """Calls completed per system call name, most first."""
    error: str | None = None

    @property
    def total(self) -> int:
        return sum(self.calls.values())

    def describe(self) -> str:
        if self.error:
            return f"strace: {self.error}"
        if not self.calls:
            return f"no system call completed in {self.seconds:g} s (strace)"
        top = ", ".join(f"{name} {n}" for name, n in list(self.calls.items())[:4])
        return f"{self.total} system call(s) in {self.seconds:g} s (strace): {top}"


def parse_strace_summary(text: str) -> dict[str, int]:
    """``strace -c``'s table -> {syscall: calls}, most calls first (the total row left out)."""
    calls: dict[str, int] = {}
    for line in text.splitlines():
        cols = line.split()
        if len(cols) >= 5 and cols[0][:1].isdigit() and cols[-1] != "total":
            try:
                calls[cols[-1]] = int(cols[3])
            except ValueError:
                continue
    return dict(sorted(calls.items(), key=lambda kv: -kv[1]))


STRACE_STOP_S = 5.0
"""How long a stopped strace may take to print its table and detach before it is killed (which detaches it
too: the kernel ends a trace when its tracer dies)."""


def strace_samples(pids: list[int], seconds: float) -> dict[int, StraceSample]:
    """``strace -c -p PID`` of every pid at once for ``seconds``, then SIGINT: strace prints its table and
    detaches.

    Ctrl-C or SIGTERM in the meantime stops every strace at once, each detached before the interrupt goes on
    (they ran in a thread pool that the interrupt waited for: Ctrl-C was ignored until the seconds passed, and a
    SIGTERM left them attached, TracerPid set, after mldebug ended). Each is also tied to this process
    (PR_SET_PDEATHSIG, SIGINT: detach), should it be killed outright."""
    import shutil
    import signal
    import subprocess

    from ml_debug.core import lifecycle

    samples = {pid: StraceSample(seconds) for pid in pids}
    exe = shutil.which("strace")
    if exe is None:
        for sample in samples.values():
            sample.error = "not installed (apt-get install strace)"
        return samples
    procs: dict[int, subprocess.Popen[str]] = {}
    interrupted = False
    with lifecycle.held_signals() as held:  # a Ctrl-C while they start is raised in the try, which stops them
        try:
            for pid in pids:
                try:
                    procs[pid] = held.popen([exe, "-c", "-p", str(pid)], stdin=subprocess.DEVNULL,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                            start_new_session=True,
                                            preexec_fn=lifecycle.tie_to_this_process(signal.SIGINT))
                except OSError as e:
                    samples[pid].error = f"could not run: {e.strerror}"
            held.release()
            deadline = time.monotonic() + seconds
            for proc in procs.values():  # each ends early only when its process does
                try:
                    proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        except KeyboardInterrupt:
            interrupted = True
        finally:
            _stop_straces(procs, samples)
    if interrupted:
        raise KeyboardInterrupt
    return samples


def _stop_straces(procs: dict[int, Any], samples: dict[int, StraceSample]) -> None:
    """SIGINT to every strace still running, then read each one's table (killed if it does not stop)."""
    import contextlib
    import signal
    import subprocess

    for proc in procs.values():
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGINT)
    deadline = time.monotonic() + STRACE_STOP_S
    for pid, proc in procs.items():
        try:
            _out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            samples[pid].error = f"did not stop within {STRACE_STOP_S:g} s of SIGINT"
            continue
        if "attached" not in err:
            last = (err.strip().splitlines() or ["no output"])[-1]
            samples[pid].error = last.removeprefix("strace: ")[:200]
            continue
        samples[pid].calls = parse_strace_summary(err)


@dataclass
class KernelView:
    """One process at one moment (two looks, ``interval_s`` apart, for the CPU share)."""

    pid: int
    state: str | None = None
    """One letter, as in ``ps -o stat``."""
    state_words: str | None = None
    wchan: str | None = None
    syscall: str | None = None
    """The call's name (``syscall 123`` when unknown), ``running`` in user space, or None when unreadable."""
    syscall_args: list[int] = field(default_factory=list)
    descriptor: Descriptor | None = None
    path: str | None = None
    """The path an open() waits on (a FIFO without a writer)."""
    cpu_share: float | None = None
    """Share of one core used over the looks."""
    looks: int = 0
    in_user_space_throughout: bool | None = None
    error: str | None = None
    """Why part of the view is missing (no permission, the process ended)."""
    strace: StraceSample | None = None
    gpu_device: str | None = None
    """An NVIDIA device file the process holds open (``/dev/nvidia0``), read only for a process that spins
    or yields: the CUDA runtime waits on the GPU that way, in frames that py-spy often cannot unwind."""
    verdict: str = ""

    @property
    def spinning(self) -> bool:
        """In user space at every look and using the CPU: a busy loop that makes no system call."""
        return bool(self.in_user_space_throughout and self.looks > 1 and self.cpu_share is not None
                    and self.cpu_share >= SPIN_CPU)


def _read(path: str, limit: int = 65536) -> str:
    with open(path, "rb") as f:
        return f.read(limit).decode("utf-8", "surrogateescape")


def _lines(path: str) -> Iterator[str]:
    """A /proc table line by line (a busy node's /proc/net/tcp has thousands)."""
    with open(path, "rb") as f:
        next(f, None)  # the header
        for raw in f:
            yield raw.decode("utf-8", "surrogateescape")


def path_argument(pid: int, address: int, limit: int = 4096) -> str | None:
    """The NUL-terminated string at ``address`` in the process (the path an open() waits on), read
    from /proc/PID/mem as ptrace would; None when it cannot be read."""
    if not address:
        return None
    try:
        fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    except OSError:
        return None
    try:
        data = os.pread(fd, limit, address)
    except OSError:
        return None
    finally:
        os.close(fd)
    end = data.find(b"\0")
    return data[:end if end >= 0 else limit].decode("utf-8", "surrogateescape") or None


def _cpu_ticks(pid: int) -> int:
    stat = _read(f"/proc/{pid}/stat")
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def _state(pid: int) -> str:
    stat = _read(f"/proc/{pid}/stat")
    return stat[stat.rindex(")") + 2:].split()[0]


def _syscall(pid: int) -> tuple[str, list[int]]:
    """('read', [args]) in a call, ('running', []) in user space; OSError without permission."""
    words = _read(f"/proc/{pid}/syscall").split()
    if not words or words[0] == "running":
        return "running", []
    nr = int(words[0])
    if nr < 0:  # blocked, but not in a system call (a page fault, a signal stop)
        return "not in a system call", []
    table = SYSCALLS.get(platform.machine(), {})
    return table.get(nr, f"syscall {nr}"), [int(w, 16) for w in words[1:7]]


def _addr(hex_addr: str) -> str:
    ip, port = hex_addr.split(":")
    raw = bytes.fromhex(ip)
    if len(raw) == 4:
        host = socket.inet_ntop(socket.AF_INET, raw[::-1])
    else:  # /proc/net/tcp6 writes four little-endian 32-bit words
        host = socket.inet_ntop(socket.AF_INET6, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
        if host.startswith("::ffff:"):
            host = host[7:]
        else:
            host = f"[{host}]"
    return f"{host}:{int(port, 16)}"


def socket_peer(pid: int, inode: str) -> str | None:
    """The addresses of socket ``inode`` in the process's network namespace (``ss -tnp`` for one socket)."""
    for table in ("tcp", "tcp6"):
        try:
            for line in _lines(f"/proc/{pid}/net/{table}"):
                cols = line.split()
                if len(cols) > 9 and cols[9] == inode:
                    local, remote = _addr(cols[1]), _addr(cols[2])
                    state = TCP_STATES.get(cols[3], cols[3])
                    return f"tcp {local} listening" if state == "listen" else f"tcp {local} -> {remote} {state}"
        except OSError:
            continue
    try:
        for line in _lines(f"/proc/{pid}/net/unix"):
            cols = line.split()
            if len(cols) > 6 and cols[6] == inode:
                return f"unix {cols[7]}" if len(cols) > 7 else "unix, unnamed"
    except OSError:
        pass
    return None


def descriptor(pid: int, fd: int) -> Descriptor | None:
    """What fd ``fd`` of ``pid`` is (readlink; the kernel's text, never followed)."""
    try:
        target = os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return None
    if target.startswith("socket:["):
        return Descriptor(fd, "socket", target, socket_peer(pid, target[8:-1]))
    if target.startswith("pipe:["):
        return Descriptor(fd, "pipe", target)
    if target.startswith("anon_inode:"):
        return Descriptor(fd, "anon", target)
    kind = "file"
    try:
        mode = os.stat(f"/proc/{pid}/fd/{fd}").st_mode  # the open file itself, as the kernel holds it
        kind = "fifo" if (mode & 0o170000) == 0o010000 else "device" if (mode & 0o170000) in (0o020000, 0o060000) \
            else "file"
    except OSError:
        pass
    return Descriptor(fd, kind, target)


def look(pid: int, interval_s: float = 0.5, looks: int = 5) -> KernelView:
    """``looks`` looks at ``pid`` over ``interval_s``: its call, wait channel, state and CPU share.

    Several looks tell a rank that spins (in user space at every look) from one that merely
    computes between calls, whatever the node's load."""
    return look_many([pid], interval_s, looks)[pid]


def look_many(pids: list[int], interval_s: float = 0.5, looks: int = 5, strace_s: float = 0.0
              ) -> dict[int, KernelView]:
    """:func:`look` at every pid together: the whole node's ranks in ``interval_s``, not one after another;
    with ``strace_s``, then an strace sample of every pid at once."""
    views = {pid: KernelView(pid) for pid in pids}
    seen: dict[int, list[tuple[str, list[int]] | None]] = {pid: [] for pid in pids}
    ticks0: dict[int, int] = {}
    t0 = time.monotonic()
    for pid in pids:
        try:
            ticks0[pid] = _cpu_ticks(pid)
        except OSError:
            pass
    for i in range(looks):
        if i:
            time.sleep(interval_s / max(1, looks - 1))
        for pid in ticks0:
            try:
                seen[pid].append(_syscall_or_none(pid, views[pid]))
            except FileNotFoundError:
                pass
    elapsed = max(time.monotonic() - t0, 1e-6)
    for pid, view in views.items():
        _finish(view, seen[pid], ticks0.get(pid), elapsed)
    if strace_s > 0:
        live = [v for v in views.values() if v.state is not None]
        for v, sample in zip(live, strace_samples([v.pid for v in live], strace_s).values(), strict=True):
            v.strace = sample
            v.verdict = verdict(v)
    return views


def _finish(view: KernelView, seen: list[tuple[str, list[int]] | None], ticks0: int | None, elapsed: float) -> None:
    pid = view.pid
    try:
        if ticks0 is None:
            raise FileNotFoundError(pid)
        view.cpu_share = (_cpu_ticks(pid) - ticks0) / os.sysconf("SC_CLK_TCK") / elapsed
        view.state = _state(pid)
        view.state_words = STATES.get(view.state, view.state)
        wchan = _read(f"/proc/{pid}/wchan").strip()
        view.wchan = wchan if wchan and wchan != "0" else None
    except FileNotFoundError:
        view.error, view.verdict = "the process ended", "ended"
        return
    except OSError as e:
        view.error = f"cannot read /proc/{pid}: {e.strerror}"
    calls = [c for c in seen if c is not None]
    if calls:
        view.syscall, view.syscall_args = calls[-1]
        view.looks = len(calls)
        view.in_user_space_throughout = all(name == "running" for name, _ in calls)
        if view.syscall in FD_FIRST and view.syscall_args:
            view.descriptor = descriptor(pid, view.syscall_args[0])
        elif view.syscall in PATH_ARG and len(view.syscall_args) > PATH_ARG[view.syscall]:
            view.path = path_argument(pid, view.syscall_args[PATH_ARG[view.syscall]])
    if view.spinning or view.syscall == "sched_yield":
        view.gpu_device = nvidia_device(pid)
    view.verdict = verdict(view)


def nvidia_device(pid: int, limit: int = 4096) -> str | None:
    """The first NVIDIA GPU device file (``/dev/nvidia0``, else ``/dev/nvidiactl``) among the process's open
    descriptors (``ls -l /proc/PID/fd``): the kernel's own link text, no file of the job is opened."""
    found: str | None = None
    try:
        names = os.listdir(f"/proc/{pid}/fd")[:limit]
    except OSError:
        return None
    for name in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if target.startswith("/dev/nvidia"):
            if target[len("/dev/nvidia"):].isdigit():
                return target
            found = found or target
    return found


def _syscall_or_none(pid: int, view: KernelView) -> tuple[str, list[int]] | None:
    try:
        return _syscall(pid)
    except FileNotFoundError:
        raise
    except PermissionError:
        view.error = "no permission to read /proc/PID/syscall (it needs ptrace rights: root or the same user)"
    except OSError as e:
        if e.errno == errno.ESRCH:
            raise FileNotFoundError(e.errno, "gone") from e
        view.error = f"cannot read /proc/{pid}/syscall: {e.strerror}"
    return None


def verdict(v: KernelView) -> str:
    """One line: ``blocked in read() on /data/part-17 (fd 17)``, ``spinning: 98% CPU, no system call``."""
    if v.state == "Z":
        return "a zombie: it exited and its parent has not reaped it"
    if v.state == "D":
        where = f" in {v.syscall}()" if v.syscall and v.syscall not in ("running", "not in a system call") else ""
        return f"in uninterruptible sleep{where}" + (f" ({v.wchan})" if v.wchan else "") + \
            ": waiting on the disk, a network file system or a driver"
    if v.state in ("T", "t"):
        return "stopped (SIGSTOP, or a debugger holds it)"
    said = _said(v)
    if v.gpu_device:
        said += f", with {v.gpu_device} open: a CUDA call waiting on the GPU looks like this"
    if v.strace and not said.endswith(f"no system call in {v.strace.seconds:g} s"):
        said += f"; {v.strace.describe()}"
    return said


def _said(v: KernelView) -> str:
    if v.spinning:
        if v.strace and not v.strace.error and not v.strace.calls:
            return f"spinning: {v.cpu_share:.0%} CPU, no system call in {v.strace.seconds:g} s"
        return f"spinning: {v.cpu_share:.0%} CPU, in user space at all {v.looks} looks (no system call)"
    if v.syscall and v.syscall not in ("running", "not in a system call"):
        on = f" on {v.descriptor.describe()} (fd {v.descriptor.fd})" if v.descriptor else \
            f" on {v.path}" if v.path else ""
        return f"blocked in {v.syscall}(){on}" + (f", wait channel {v.wchan}" if v.wchan else "")
    if v.syscall == "running":
        share = f" ({v.cpu_share:.0%} CPU)" if v.cpu_share is not None else ""
        return f"running in user space{share}"
    return v.error or (f"{v.state_words}" if v.state_words else "unknown")

