"""Host checks worth running before a job: swap, stuck processes, /dev/shm, open files,
disk space and inodes, clock sync, CPU governor. Standard library only; each takes
milliseconds (the clock check may run one short subprocess)."""

from __future__ import annotations

import ctypes
import glob
import os
import resource
import shutil
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

from ml_debug.core import bounded
from ml_debug.health.result import Check, Status

GiB = 2**30


def _gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB"


def _meminfo(root: str = "/proc") -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        for line in Path(root, "meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                out[key] = int(parts[0]) * (1024 if len(parts) > 1 else 1)
    except OSError:
        pass
    return out


def check_swap() -> Check:
    """Swap in use (``swapon --show``, ``free -h``)."""
    mem = _meminfo()
    src = "/proc/meminfo"
    if "SwapTotal" not in mem:
        return Check("host.swap", "host", Status.SKIP, "N/A", "off", "/proc/meminfo not readable", src)
    total, used = mem["SwapTotal"], mem["SwapTotal"] - mem.get("SwapFree", 0)
    data = {"total_bytes": total, "used_bytes": used}
    if total == 0:
        return Check("host.swap", "host", Status.PASS, "off", "off", "", src, data)
    return Check("host.swap", "host", Status.WARN, f"on ({_gib(total)}, {_gib(used)} used)", "off",
                 "a rank whose memory swaps runs many times slower and the others time out waiting for it; "
                 "`swapoff -a` on training nodes", src, data)


def d_state_processes(proc: str = "/proc") -> list[tuple[int, str, str]]:
    """(pid, comm, wchan) of processes in uninterruptible sleep (``ps -eo pid,stat,wchan,comm | awk '$2~/D/'``)."""
    out = []
    for stat in glob.glob(f"{proc}/[0-9]*/stat"):
        try:
            text = Path(stat).read_text()
        except OSError:
            continue
        # comm may contain spaces and parentheses: the state follows the last ')'
        rparen = text.rfind(")")
        if rparen < 0 or text[rparen + 2: rparen + 3] != "D":
            continue
        pid = int(text.split(" ", 1)[0])
        comm = text[text.find("(") + 1: rparen]
        try:
            wchan = Path(stat).with_name("wchan").read_text().strip() or "?"
        except OSError:
            wchan = "?"
        out.append((pid, comm, wchan))
    return out


def check_d_state(settle_s: float = 0.2) -> Check:
    """Processes stuck in D state: sampled twice, only the ones that stay count (short I/O waits are normal)."""
    src = "/proc/*/stat (state D)"
    first = {p[0]: p for p in d_state_processes()}
    if first:
        time.sleep(settle_s)
    stuck = [p for p in d_state_processes() if p[0] in first]
    if not stuck:
        return Check("host.d_state", "host", Status.PASS, "0", "0", "", src)
    names = ", ".join(f"{pid} {comm} ({wchan})" for pid, comm, wchan in stuck[:5])
    return Check("host.d_state", "host", Status.WARN, str(len(stuck)), "0",
                 f"processes stuck in uninterruptible sleep: {names}; usually a hung filesystem (NFS/Lustre) or "
                 "driver: such ranks cannot be killed; check `cat /proc/<pid>/stack`, dmesg", src,
                 {"processes": [{"pid": p, "comm": c, "wchan": w} for p, c, w in stuck]})


def check_shm(min_bytes: int = 1 * GiB, path: str = "/dev/shm") -> Check:
    """/dev/shm size (``df -h /dev/shm``): NCCL and DataLoader workers live in it."""
    src = f"statvfs({path})"
    try:
        st = os.statvfs(path)
    except OSError as e:
        return Check("host.shm", "host", Status.FAIL, "missing", f">= {_gib(min_bytes)}",
                     f"{path} not available ({e.strerror}): NCCL and DataLoader workers need it; mount a tmpfs there",
                     src)
    size, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    data = {"size_bytes": size, "free_bytes": free}
    value = f"{_gib(size)} ({_gib(free)} free)"
    if size < min_bytes:
        return Check("host.shm", "host", Status.FAIL, value, f">= {_gib(min_bytes)}",
                     "too small: NCCL fails with 'unhandled system error' and DataLoader workers with 'Bus error'; "
                     "in Docker use --shm-size=16g or --ipc=host", src, data)
    if free < min_bytes:
        return Check("host.shm", "host", Status.WARN, value, f">= {_gib(min_bytes)} free",
                     "nearly full: leftover files from dead jobs? `ls -la /dev/shm` and remove stale ones", src, data)
    return Check("host.shm", "host", Status.PASS, value, f">= {_gib(min_bytes)}", "", src, data)


def check_nofile(minimum: int = 65536) -> Check:
    """Soft open-file limit (``ulimit -n``)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    src = "getrlimit(RLIMIT_NOFILE)"
    fmt = lambda v: "unlimited" if v == resource.RLIM_INFINITY else str(v)  # noqa: E731
    value = f"{fmt(soft)} (hard {fmt(hard)})"
    data = {"soft": soft, "hard": hard}
    if soft != resource.RLIM_INFINITY and soft < minimum:
        status = Status.FAIL if soft < 4096 else Status.WARN
        return Check("host.nofile", "host", status, value, f">= {minimum}",
                     "DataLoader workers, NCCL sockets and checkpoint shards run out of file descriptors "
                     "('Too many open files'); raise it: `ulimit -n 1048576` or limits.conf / Slurm's PropagateResourceLimits",
                     src, data)
    return Check("host.nofile", "host", Status.PASS, value, f">= {minimum}", "", src, data)


def check_disk(path: str, min_free_bytes: int = 10 * GiB, min_free_frac: float = 0.05,
               min_inode_frac: float = 0.05) -> list[Check]:
    """Free space and inodes on one path (``df -h PATH``, ``df -i PATH``)."""
    src = f"statvfs({path})"
    try:
        st = os.statvfs(path)
    except OSError as e:
        return [Check("host.disk", path, Status.FAIL, "not accessible", "exists",
                      f"{path}: {e.strerror}; is the filesystem mounted?", src)]
    size, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    out: list[Check] = []
    frac = free / size if size else 0.0
    value = f"{_gib(free)} free of {_gib(size)} ({frac:.0%})"
    thr = f">= {_gib(min_free_bytes)} and >= {min_free_frac:.0%}"
    data = {"free_bytes": free, "size_bytes": size}
    if size and (free < min_free_bytes or frac < min_free_frac):
        status = Status.FAIL if free < min_free_bytes / 10 else Status.WARN
        out.append(Check("host.disk", path, status, value, thr,
                         "checkpoints and logs written here will fail or truncate: free space or point the job elsewhere",
                         src, data))
    else:
        out.append(Check("host.disk", path, Status.PASS, value, thr, "", src, data))
    if st.f_files:
        ifrac = st.f_favail / st.f_files
        ivalue = f"{st.f_favail} free of {st.f_files} ({ifrac:.0%})"
        idata = {"free_inodes": st.f_favail, "inodes": st.f_files}
        if ifrac < min_inode_frac:
            out.append(Check("host.inodes", path, Status.FAIL if ifrac < 0.01 else Status.WARN, ivalue,
                             f">= {min_inode_frac:.0%}", "out of inodes: file creation fails even with free space "
                             "(many small files, e.g. extracted datasets or caches); clean up", src, idata))
        else:
            out.append(Check("host.inodes", path, Status.PASS, ivalue, f">= {min_inode_frac:.0%}", "", src, idata))
    return out


class _Timeval(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_usec", ctypes.c_long)]


class _Timex(ctypes.Structure):
    # struct timex from <sys/timex.h> (Linux); 11 trailing ints of padding
    _fields_ = [("modes", ctypes.c_uint), ("offset", ctypes.c_long), ("freq", ctypes.c_long),
                ("maxerror", ctypes.c_long), ("esterror", ctypes.c_long), ("status", ctypes.c_int),
                ("constant", ctypes.c_long), ("precision", ctypes.c_long), ("tolerance", ctypes.c_long),
                ("time", _Timeval), ("tick", ctypes.c_long), ("ppsfreq", ctypes.c_long), ("jitter", ctypes.c_long),
                ("shift", ctypes.c_int), ("stabil", ctypes.c_long), ("jitcnt", ctypes.c_long),
                ("calcnt", ctypes.c_long), ("errcnt", ctypes.c_long), ("stbcnt", ctypes.c_long),
                ("tai", ctypes.c_int), ("_pad", ctypes.c_int * 11)]


def kernel_clock_state() -> tuple[bool, str] | None:
    """(synchronized, detail) from adjtimex(2) with modes=0 (read-only, no privilege needed)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        tx = _Timex()
        state = libc.adjtimex(ctypes.byref(tx))
    except (OSError, AttributeError):
        return None
    if state < 0:
        return None
    unsync = bool(tx.status & 0x40) or state == 5  # STA_UNSYNC / TIME_ERROR
    return (not unsync, f"adjtimex: state {state}, maxerror {tx.maxerror} us")


def _run(argv: list[str], timeout: float = 2.0) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        cp = bounded.run(argv, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return cp.stdout if cp.returncode == 0 else None


def check_clock_sync() -> Check:
    """NTP/PTP sync state: timedatectl, then chronyc, then the kernel's own flag (adjtimex)."""
    out = _run(["timedatectl", "show", "-p", "NTPSynchronized", "--value"])
    if out is not None and out.strip() in ("yes", "no"):
        synced, src, detail = out.strip() == "yes", "timedatectl NTPSynchronized", out.strip()
    else:
        out = _run(["chronyc", "-n", "tracking"])
        leap = next((ln.split(":", 1)[1].strip() for ln in (out or "").splitlines() if ln.startswith("Leap status")), None)
        if leap is not None:
            synced, src, detail = leap == "Normal", "chronyc tracking", f"leap status {leap}"
        else:
            state = kernel_clock_state()
            if state is None:
                return Check("host.clock_sync", "host", Status.SKIP, "unknown", "synchronized",
                             "no timedatectl/chronyc answer and adjtimex unavailable", "timedatectl/chronyc/adjtimex")
            synced, detail = state
            src = "adjtimex(2)"
    if synced:
        return Check("host.clock_sync", "host", Status.PASS, "synchronized", "synchronized", "", src, {"detail": detail})
    return Check("host.clock_sync", "host", Status.WARN, "not synchronized", "synchronized",
                 "clocks drift between nodes: logs and traces do not line up and munge/Slurm auth can fail; "
                 "run chrony/ntpd (in a VM or container the host may sync it: check there)", src, {"detail": detail})


def check_cpu_governor(sysfs: str = "/sys/devices/system/cpu") -> Check:
    """CPU frequency governor (``cpupower frequency-info``)."""
    files = glob.glob(f"{sysfs}/cpu[0-9]*/cpufreq/scaling_governor")
    src = f"{sysfs}/cpu*/cpufreq/scaling_governor"
    if not files:
        return Check("host.cpu_governor", "host", Status.SKIP, "N/A", "performance",
                     "no cpufreq in sysfs (a VM or a container without it): nothing to check", src)
    govs: dict[str, int] = {}
    for f in files:
        try:
            g = Path(f).read_text().strip()
        except OSError:
            continue
        govs[g] = govs.get(g, 0) + 1
    value = ", ".join(f"{g} x{n}" for g, n in sorted(govs.items()))
    if set(govs) - {"performance"}:
        return Check("host.cpu_governor", "host", Status.WARN, value, "performance",
                     "a power-saving governor slows data loading and kernel launches: "
                     "`cpupower frequency-set -g performance`", src, {"governors": govs})
    return Check("host.cpu_governor", "host", Status.PASS, value, "performance", "", src, {"governors": govs})


def default_paths() -> list[str]:
    """Where jobs usually write: the working directory and the temp dir."""
    import tempfile

    seen: list[str] = []
    for p in (os.getcwd(), tempfile.gettempdir()):
        if p not in seen:
            seen.append(p)
    return seen


def host_checks(paths: Iterable[str] | None = None, shm_min_bytes: int = 1 * GiB,
                nofile_min: int = 65536, disk_min_free_bytes: int = 10 * GiB) -> list[Check]:
    """Every host check, in the order the table shows them."""
    out = [check_swap(), check_d_state(), check_shm(shm_min_bytes), check_nofile(nofile_min)]
    for p in (list(paths) if paths else default_paths()):
        out += check_disk(p, disk_min_free_bytes)
    out += [check_clock_sync(), check_cpu_governor()]
    return out
