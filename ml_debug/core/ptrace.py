"""May this process attach to that one? Yama ptrace_scope, CAP_SYS_PTRACE, uids, containers.

Every dumper (py-spy, pystack, gdb) needs ptrace. When it is refused, the fix depends on why,
and a person should be told exactly which one applies.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

CAP_SYS_PTRACE = 19
YAMA = Path("/proc/sys/kernel/yama/ptrace_scope")


@dataclass
class PtraceCheck:
    """What this node allows, read once before dumping."""

    euid: int
    has_cap_sys_ptrace: bool
    yama_scope: int | None  # None: no Yama LSM (same as 0)
    in_container: bool
    seccomp: int | None  # 0 off, 1 strict, 2 filter
    problems: list[str] = field(default_factory=list)

    def denial(self, target_uid: int | None) -> tuple[str, str] | None:
        """(reason, fix) when attaching to a process of `target_uid` will be refused, else None."""
        cap_fix = self._cap_fix()
        if self.yama_scope == 3:
            return ("kernel.yama.ptrace_scope=3 forbids ptrace for everyone, root included",
                    "it can only be lowered by a reboot (set kernel.yama.ptrace_scope=1 or 0 in /etc/sysctl.d/)")
        if self.has_cap_sys_ptrace:
            return None
        if target_uid is not None and target_uid != self.euid:
            return (f"the process belongs to uid {target_uid} and this mldebug runs as uid {self.euid} "
                    "without CAP_SYS_PTRACE", f"run mldebug as that user, or {cap_fix}")
        if self.yama_scope == 2:
            return ("kernel.yama.ptrace_scope=2 allows ptrace only with CAP_SYS_PTRACE", cap_fix)
        if self.yama_scope == 1:
            return ("kernel.yama.ptrace_scope=1 allows ptrace only of one's own child processes",
                    f"sudo sysctl kernel.yama.ptrace_scope=0 (until reboot), or {cap_fix}")
        return None

    def _cap_fix(self) -> str:
        if self.in_container:
            return ("start the container with --cap-add SYS_PTRACE (docker/podman), or add SYS_PTRACE to "
                    "securityContext.capabilities.add (Kubernetes), or run mldebug on the host with sudo")
        return "run it with sudo (root has CAP_SYS_PTRACE): sudo -E $(which mldebug) dump-stacks ..."


def _status_field(name: str) -> str | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(name + ":"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def in_container() -> bool:
    """Docker, podman, or a Kubernetes pod (best effort)."""
    if Path("/.dockerenv").exists() or Path("/run/.containerenv").exists():
        return True
    try:
        cgroup = Path("/proc/1/cgroup").read_text()
    except OSError:
        return False
    return any(word in cgroup for word in ("docker", "kubepods", "containerd", "libpod"))


def check_ptrace() -> PtraceCheck:
    """Read this node's ptrace policy (`cat /proc/sys/kernel/yama/ptrace_scope`, `grep Cap /proc/self/status`)."""
    cap_eff = _status_field("CapEff")
    has_cap = bool(int(cap_eff, 16) >> CAP_SYS_PTRACE & 1) if cap_eff else os.geteuid() == 0
    try:
        scope: int | None = int(YAMA.read_text().strip())
    except (OSError, ValueError):
        scope = None
    sec = _status_field("Seccomp")
    check = PtraceCheck(euid=os.geteuid(), has_cap_sys_ptrace=has_cap, yama_scope=scope,
                        in_container=in_container(), seccomp=int(sec) if sec and sec.isdigit() else None)
    if scope == 3:
        check.problems.append("kernel.yama.ptrace_scope=3: no process may be traced")
    elif not has_cap and scope in (1, 2):
        check.problems.append(f"kernel.yama.ptrace_scope={scope} and no CAP_SYS_PTRACE")
    return check
