"""core/ptrace: what this node allows, read from the real /proc, and the one fix named for each refusal."""

from __future__ import annotations

import os
from pathlib import Path

from ml_debug.core.ptrace import CAP_SYS_PTRACE, YAMA, PtraceCheck, check_ptrace


def _cap_eff() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    raise AssertionError("no CapEff in /proc/self/status")


def test_the_check_reads_this_nodes_real_policy() -> None:
    check = check_ptrace()
    assert check.euid == os.geteuid()
    assert check.has_cap_sys_ptrace == bool(_cap_eff() >> CAP_SYS_PTRACE & 1)
    assert check.yama_scope == (int(YAMA.read_text()) if YAMA.exists() else None)
    # what the check says about attaching to this very user's processes matches the policy it read
    denied = check.denial(os.geteuid())
    assert (denied is None) == (check.has_cap_sys_ptrace and check.yama_scope != 3
                                or not check.has_cap_sys_ptrace and check.yama_scope in (None, 0))


def _check(**kw: object) -> PtraceCheck:
    args: dict = {"euid": 1000, "has_cap_sys_ptrace": False, "yama_scope": 0, "in_container": False,
                  "seccomp": 0} | kw
    return PtraceCheck(**args)


def test_each_refusal_names_its_own_fix() -> None:
    assert _check().denial(1000) is None
    assert _check(yama_scope=None).denial(None) is None  # no Yama: like 0
    why, fix = _check(has_cap_sys_ptrace=True, yama_scope=3).denial(1000)  # type: ignore[misc]
    assert "ptrace_scope=3" in why and "reboot" in fix  # root cannot either
    why, fix = _check().denial(0)  # type: ignore[misc]
    assert why.startswith("the process belongs to uid 0") and fix.startswith("run mldebug as that user, or run it with sudo")
    why, fix = _check(yama_scope=1).denial(1000)  # type: ignore[misc]
    assert "own child processes" in why and "sysctl kernel.yama.ptrace_scope=0" in fix
    why, fix = _check(yama_scope=2, in_container=True).denial(1000)  # type: ignore[misc]
    assert "CAP_SYS_PTRACE" in why and "--cap-add SYS_PTRACE" in fix
    assert _check(has_cap_sys_ptrace=True, yama_scope=2).denial(0) is None
